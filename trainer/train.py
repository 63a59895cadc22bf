"""Headless training: build everything from a ``RunConfig`` and run the loop.

    python -m trainer.train --config cpu --env MiniHack-Room-5x5 --method grpo --steps 20 \\
        --set actor.lr=2e-5 --out var/runs/room5
    python -m trainer.train --resume var/runs/room5 --steps 40      # continue the same run

``manage.py train`` takes the same arguments (``webapp/management/commands/train.py``). This module is only
the entry point: ``trainer.assemble`` builds the run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from trainer import paths
from trainer.assemble import file_reporters, train
from trainer.checkpoint import read_checkpoint
from trainer.config import ConfigError, RunConfig, get_preset
from trainer.loop import Metrics
from trainer.report import ConsoleReporter

__all__ = ["add_arguments", "config_from_args", "main", "run_from_args", "train"]


# ---- command line (shared with manage.py train) ---------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="a preset (cpu, paper) or a .json/.toml config file [cpu]")
    parser.add_argument("--env", help="an environment name or a task mixture (3-task, 6-task)")
    parser.add_argument(
        "--method",
        help="grpo, static_online, exp_only or complementary (all but grpo need the experience bank: "
        "manage.py train)",
    )
    parser.add_argument("--steps", type=int, help="actor steps in total")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. actor.lr=2e-5",
    )
    parser.add_argument(
        "--resume", type=Path, help="a checkpoint folder, or a run folder to resume its latest"
    )
    parser.add_argument("--out", type=Path, help="run folder for checkpoints and metrics [var/runs/<time>]")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config: preset or file (or the checkpoint's, when resuming without --config), then flags."""
    if args.config:
        path = Path(args.config)
        cfg = RunConfig.from_file(path) if path.suffix in (".json", ".toml") else get_preset(args.config)
    elif args.resume:
        cfg = read_checkpoint(args.resume).config
    else:
        cfg = get_preset("cpu")
    overrides = {k: v for k, v in (("env", args.env), ("method", args.method), ("steps", args.steps)) if v}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set needs KEY=VALUE (got {item!r})")
        overrides[key.strip()] = value.strip()
    return cfg.with_overrides(**overrides) if overrides else cfg


def run_from_args(args: argparse.Namespace, stdout: IO[str] | None = None) -> Metrics:
    cfg = config_from_args(args)
    out = args.out
    if out is None:
        out = args.resume if args.resume and not (Path(args.resume) / "state.json").exists() else None
    out = out or paths.var_dir() / "runs" / time.strftime("%Y%m%d-%H%M%S")
    reporter = file_reporters(Path(out), ConsoleReporter(stdout))
    metrics, loop = train(cfg, out_dir=Path(out), resume=args.resume, reporter=reporter)
    print(f"run folder: {out}; last checkpoint: {loop.last_checkpoint}", file=stdout or sys.stdout)
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run_from_args(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

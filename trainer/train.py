"""Headless training: build everything from a ``RunConfig`` and run the loop.

    python -m trainer.train --config cpu --env MiniHack-Room-5x5 --method grpo --steps 20 \\
        --set actor.lr=2e-5 --out var/runs/room5
    python -m trainer.train --resume var/runs/room5 --steps 40      # continue the same run
    python -m trainer.train --config cpu --method grpo --nproc 2       # one run, 2 processes (torchrun)
    python -m trainer.train --resume var/runs/room5 --nproc 1       # the same run, on 1 process now

With ``--nproc N`` (or ``nproc`` in the config) above 1 this process starts ``torchrun`` with the same
arguments (``launch``); each of its ranks runs this module again, finds itself in the group and trains its
share (``trainer.parallel``). On several nodes, start torchrun on each node yourself, with ``--nproc`` the
total number of processes (see docs/scaling-out.md). When the torchrun group fails, this process says how to
resume the run from its last checkpoint, on any number of processes (``resume_hint``).

``manage.py train`` takes the same arguments (``webapp/management/commands/train.py``). This module is only
the entry point: ``trainer.assemble`` builds the run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from trainer import parallel, paths, runrecord
from trainer.assemble import file_reporters, train
from trainer.checkpoint import find_checkpoint, read_checkpoint
from trainer.config import ConfigError, RunConfig, get_preset
from trainer.metrics import Metrics
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
    parser.add_argument(
        "--nproc",
        type=int,
        help="training processes (sets nproc): above 1, torchrun starts them on this machine [1]",
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config: preset or file (or the checkpoint's, when resuming without --config), then flags."""
    if args.config:
        path = Path(args.config)
        cfg = RunConfig.from_file(path) if path.suffix in (".json", ".toml") else get_preset(args.config)
    elif args.resume:
        cfg = read_checkpoint(args.resume).config
    else:
        cfg = get_preset("cpu")
    flags = (("env", args.env), ("method", args.method), ("steps", args.steps), ("nproc", args.nproc))
    overrides = {k: v for k, v in flags if v}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set needs KEY=VALUE (got {item!r})")
        overrides[key.strip()] = value.strip()
    return cfg.with_overrides(**overrides) if overrides else cfg


def out_dir_from_args(args: argparse.Namespace) -> Path:
    """The run folder: ``--out``, the run folder being resumed, or a new one named by the time."""
    out = args.out
    if out is None:
        out = args.resume if args.resume and not (Path(args.resume) / "state.json").exists() else None
    return Path(out or paths.var_dir() / "runs" / time.strftime("%Y%m%d-%H%M%S"))


def resumed_step(args: argparse.Namespace) -> int:
    """The step a resumed run goes on from (its checkpoint's), 0 for a fresh run."""
    return read_checkpoint(args.resume).step if args.resume else 0


def run_from_args(args: argparse.Namespace, stdout: IO[str] | None = None) -> Metrics:
    cfg = config_from_args(args)
    out = out_dir_from_args(args)
    reporter = file_reporters(out, ConsoleReporter(stdout)) if is_rank_zero() else None
    if is_rank_zero():
        runrecord.start_attempt(out, cfg, resumed_step(args), sys.argv)
    status = "failed"
    try:
        metrics, loop = train(cfg, out_dir=out, resume=args.resume, reporter=reporter)
        parallel.barrier()
        status = "succeeded"
    finally:
        parallel.destroy()
        if is_rank_zero():
            runrecord.finish(out, status)
    if is_rank_zero():
        print(f"run folder: {out}; last checkpoint: {loop.last_checkpoint}", file=stdout or sys.stdout)
    return metrics


# ---- many processes (torchrun) --------------------------------------------------------------------


def in_torchrun() -> bool:
    """This process is a rank that torchrun started (it sets TORCHELASTIC_RUN_ID for every rank)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def torchrun_command(argv: Sequence[str], nproc: int, out: Path, module: str = "trainer.train") -> list[str]:
    """``torchrun --standalone --nproc-per-node N -m trainer.train ARGV --out OUT`` with this Python: every
    rank gets the same arguments and one run folder (a default one is named by the time, which differs
    by rank)."""
    argv = _without_nproc(argv) + ["--set", f"nproc={nproc}"]  # torchrun's parser takes --nproc as its own
    if "--out" not in argv:
        argv += ["--out", str(out)]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*launcher, "-m", module, *argv]


def _without_nproc(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--nproc="):
            skip = False
            continue
        skip = arg == "--nproc"
        if not skip:
            out.append(arg)
    return out


def launch(argv: Sequence[str], nproc: int, out: Path) -> int:
    """Train on ``nproc`` processes of this machine through torchrun; its exit code (0: every rank ended
    well; torchrun stops the others when one fails)."""
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(torchrun_command(argv, nproc, out), env=env).returncode


def resume_hint(out: Path, code: int) -> str:
    """What to run after the torchrun group of a run failed (exit ``code``): the command that resumes its last
    checkpoint in ``out``, on any number of processes (``trainer.checkpoint``: a checkpoint loads into any
    number of ranks)."""
    failed = f"training failed: torchrun exited with code {code}"
    try:
        checkpoint = find_checkpoint(out)
    except FileNotFoundError:
        return f"{failed} before the run's first checkpoint in {out}: start it again"
    return (
        f"{failed}. To go on from its last checkpoint ({checkpoint.name}):\n"
        f"    python -m trainer.train --resume {shlex.quote(str(out))}\n"
        "with the same config (the checkpoint's); add --nproc N to resume on another number of processes "
        "(a checkpoint loads into any number of ranks), --steps N to train longer"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        if cfg.nproc > 1 and not in_torchrun():
            out = out_dir_from_args(args)
            code = launch(sys.argv[1:] if argv is None else argv, cfg.nproc, out)
            if code != 0:
                print(resume_hint(out, code), file=sys.stderr)
            return code
        run_from_args(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

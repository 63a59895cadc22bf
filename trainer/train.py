"""Headless training: build everything from a ``RunConfig`` and run the loop.

    python -m trainer.train --config cpu --env MiniHack-Room-5x5 --method grpo --steps 20 \\
        --set actor.lr=2e-5 --out var/runs/room5
    python -m trainer.train --resume var/runs/room5 --steps 40      # continue the same run

``manage.py train`` takes the same arguments (``webapp/management/commands/train.py``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from trainer import paths
from trainer.actor import ActorUpdate
from trainer.checkpoint import CheckpointState, check_resumable, load_checkpoint, read_checkpoint
from trainer.config import ConfigError, RunConfig, get_preset
from trainer.envs.base import make_mixture
from trainer.loop import Metrics, TrainingLoop
from trainer.models import load_causal_lm, load_tokenizer
from trainer.report import ConsoleReporter, JsonlReporter, Reporter, Reporters
from trainer.rollout.base import Engine, engine_from_config
from trainer.rollout.runner import Retriever
from trainer.store import ExperienceStore


def build_engine(cfg: RunConfig) -> Engine:
    """The rollout engine of ``cfg.rollout`` serving the actor's initial weights."""
    return engine_from_config(cfg.actor.model_path, cfg.rollout, seed=cfg.seed)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_actor(
    cfg: RunConfig, out_dir: Path, resume: Path | None
) -> tuple[CheckpointState | None, Any, Any, ActorUpdate]:
    """What every method does before its loop: check the env and the checkpoint to resume (before loading
    anything), write the run's config, seed, load the actor (and its optimiser state when resuming)."""
    make_mixture(cfg.env)
    state = None
    if resume is not None:
        state = read_checkpoint(Path(resume))
        check_resumable(state.config, cfg)
        if state.step >= cfg.steps:
            raise ConfigError(
                f"the checkpoint is at step {state.step} already; pass --steps above it to go on"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    seed_everything(cfg.seed)
    tokenizer = load_tokenizer(cfg.actor.model_path)
    model = load_causal_lm(cfg.actor.model_path)
    actor = ActorUpdate(model, cfg.actor, estimator=cfg.advantage_estimator)
    if state is not None:
        load_checkpoint(state, model=model, optimizer=actor.optimizer)
    return state, tokenizer, model, actor


def sync_if_stale(actor: ActorUpdate, engine: Engine, state: CheckpointState | None) -> None:
    """The engine must serve the actor's weights: after a resume, or when it served another run before."""
    if state is not None or engine.weight_version != 0:
        actor.sync(engine, max(engine.weight_version, state.engine_version if state else 0) + 1)


def train(
    cfg: RunConfig,
    *,
    out_dir: Path,
    resume: Path | None = None,
    reporter: Reporter | None = None,
    engine: Engine | None = None,
    retrieve: Retriever | None = None,
    store: ExperienceStore | None = None,
    extractor_engine: Engine | None = None,
) -> tuple[Metrics, TrainingLoop]:
    """Train the actor of ``cfg``, writing checkpoints and ``metrics.jsonl`` under ``out_dir``.

    Methods that use experience (static_online, exp_only, complementary) run ``trainer.coevolution.train``
    with ``store`` (the run's experience bank, required) and ``extractor_engine`` (optional, reused).

    ``resume``: a checkpoint folder or a run's out dir (its latest checkpoint); the config must equal the
    checkpoint's except ``steps``. ``engine``: reuse a running engine (its weights are re-synced from the
    actor first); by default one is built from the config and closed at the end.
    Returns the last metrics and the loop (its ``last_checkpoint``, ``model`` ...).
    """
    if cfg.uses_experience:
        from trainer import coevolution

        return coevolution.train(
            cfg,
            store=store,
            out_dir=out_dir,
            resume=resume,
            reporter=reporter,
            engine=engine,
            extractor_engine=extractor_engine,
        )
    out_dir = Path(out_dir)
    state, tokenizer, model, actor = prepare_actor(cfg, out_dir, resume)

    own_engine = engine is None
    engine = build_engine(cfg) if engine is None else engine
    try:
        sync_if_stale(actor, engine, state)
        reporter = reporter or Reporters(ConsoleReporter(), JsonlReporter(out_dir / "metrics.jsonl"))
        loop = TrainingLoop(
            cfg,
            engine=engine,
            model=model,
            tokenizer=tokenizer,
            out_dir=out_dir,
            reporter=reporter,
            actor=actor,
            start_step=state.step + 1 if state else 1,
            retrieve=retrieve,
        )
        return loop.run(), loop
    finally:
        if own_engine:
            engine.close()


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
    reporter = Reporters(ConsoleReporter(stdout), JsonlReporter(Path(out) / "metrics.jsonl"))
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

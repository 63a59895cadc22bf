"""One place assembles a run: read the config, build what its method needs, pick the loop (docs/design.md §8).

    train(cfg, out_dir=..., store=...)   # every entry point: trainer.train (CLI), the Celery task,
                                         # manage.py train, the experiment runner

- every method: the actor (its model, tokenizer and update), the actor's rollout engine, the reporters,
  and the run's ``Checkpointer``, which resumes the models from a checkpoint if asked and writes the
  run's checkpoints;
- methods that use experience (static_online, exp_only, complementary): the experience store (passed in:
  it needs the database), πϕ's engine, πϕ's update when it trains, and ``CoevolutionLoop`` instead of the
  plain ``TrainingLoop``.

Modules import downward: ``trainer.train`` (the CLI) → this module → ``trainer.coevolution`` and
``trainer.loop``; nothing imports back up.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import parallel
from trainer.actor import ActorUpdate
from trainer.cancel import CancelToken
from trainer.checkpoint import EXTRACTOR_DIR, Checkpointer, CheckpointState, check_resumable, read_checkpoint
from trainer.coevolution import METRICS_FILE, CoevolutionLoop, HelperRankLoop, work_left
from trainer.config import ConfigError, ExtractorConfig, RunConfig
from trainer.envs.base import make_mixture
from trainer.extractor.model import Extractor
from trainer.extractor.update import ExtractorUpdate
from trainer.loop import TrainingLoop
from trainer.lora import apply_lora, frozen_in, has_adapter, load_adapter
from trainer.metrics import Metrics
from trainer.models import load_causal_lm, load_tokenizer
from trainer.report import (
    BaseReporter,
    ConsoleReporter,
    EpisodeLogReporter,
    JsonlReporter,
    Reporter,
    Reporters,
    RunClock,
)
from trainer.rollout.base import Engine, engine_from_config
from trainer.rollout.runner import Retriever
from trainer.runfiles import FAILURES_FILE
from trainer.store import ExperienceStore
from trainer.trackers import tracker_reporters


def build_engine(cfg: RunConfig) -> Engine:
    """The rollout engine of ``cfg.rollout`` serving the actor's initial weights."""
    return engine_from_config(cfg.actor.model_path, cfg.rollout, seed=cfg.seed, device=cfg.device)


def build_extractor_engine(cfg: RunConfig) -> Engine:
    """πϕ's inference engine, configured like the actor's (``cfg.rollout``) but for the extractor model and
    with its own KV cache size when ``extractor.kv_cache_gib`` is set."""
    rollout = cfg.rollout
    if cfg.extractor.kv_cache_gib is not None:
        rollout = dataclasses.replace(rollout, kv_cache_gib=cfg.extractor.kv_cache_gib)
    return engine_from_config(cfg.extractor.model_path, rollout, seed=cfg.seed + 1, device=cfg.device)


def file_reporters(out_dir: Path, *more: Reporter) -> Reporters:
    """What every run writes into its folder: ``metrics.jsonl`` and ``episodes.jsonl`` (plus ``more``)."""
    out_dir = Path(out_dir)
    return Reporters(
        *more, JsonlReporter(out_dir / METRICS_FILE), EpisodeLogReporter(out_dir / "episodes.jsonl")
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def read_resume_point(cfg: RunConfig, resume: Path | None, out_dir: Path) -> CheckpointState | None:
    """The checkpoint to resume from, checked against ``cfg`` before anything loads. One of the last step
    is resumed only to finish the extractor work the lost attempt left (``work_left``)."""
    if resume is None:
        return None
    state = read_checkpoint(Path(resume))
    check_resumable(state.config, cfg)
    if state.new_settings:  # the same config as far as it can tell, but behaviour may differ: say so
        now = ", ".join(f"{k} = {v!r}" for k, v in state.new_settings.items())
        print(f"training: the checkpoint predates {now}: they take these values from here on", flush=True)
    finishing = state.step == cfg.steps and work_left(out_dir, state.path)
    if state.step >= cfg.steps and not finishing:
        raise ConfigError(f"the checkpoint is at step {state.step} already; pass --steps above it to go on")
    return state


def prepare_actor(
    cfg: RunConfig, out_dir: Path, placement: parallel.Placement | None = None
) -> tuple[Any, Any, ActorUpdate]:
    """Write the run's config, seed, load the actor onto the placement's device, sharded over its torchrun
    group if any (``trainer.parallel``). A resumed run's weights come from its ``Checkpointer``."""
    placement = placement or parallel.init_distributed(cfg.device, cfg.collective_timeout_s)
    if parallel.is_main():
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    seed_everything(cfg.seed)
    tokenizer = load_tokenizer(cfg.actor.model_path)
    model = apply_lora(load_causal_lm(cfg.actor.model_path), cfg.actor.lora)
    model = parallel.parallelize(model, placement, activation_checkpointing=cfg.actor.gradient_checkpointing)
    model = frozen_in(model, placement.param_dtype)  # a LoRA actor's frozen base: bf16 on CUDA
    return tokenizer, model, ActorUpdate(model, cfg.actor, estimator=cfg.advantage_estimator)


def sync_if_stale(actor: ActorUpdate, engine: Engine, state: CheckpointState | None) -> None:
    """The engine must serve the actor's weights: after a resume, or when it served another run before."""
    if state is not None or engine.weight_version != 0:
        actor.sync(engine, max(engine.weight_version, state.engine_version if state else 0) + 1)


def resume_models(
    checkpointer: Checkpointer, actor: ActorUpdate, state: CheckpointState | None, engine: Engine
) -> None:
    """Load the checkpoint being resumed (if any) into the models, then have the engines serve them."""
    checkpointer.load(state)
    sync_if_stale(actor, engine, state)
    extractor, update = checkpointer.extractor, checkpointer.extractor_update
    if update is not None and (extractor.engine.weight_version != 0 or state is not None):
        update.sync(extractor)


def load_extractor_model(x: ExtractorConfig, saved: Path | None) -> torch.nn.Module:
    """πϕ's trainer model: the checkpoint's ``saved`` weights when resuming (its model folder, or its LoRA
    adapter on the base model), else the configured model (with a fresh adapter when LoRA is on)."""
    if saved is not None and (saved / "config.json").exists():  # a full fine-tune's weights
        return load_causal_lm(saved)
    model = apply_lora(load_causal_lm(x.model_path), x.lora)
    if saved is not None and x.lora.enabled and has_adapter(saved):
        load_adapter(model, saved)
    return model


def build_extractor(
    cfg: RunConfig,
    engine: Engine,
    state: CheckpointState | None,
    out_dir: Path | None = None,
    placement: parallel.Placement | None = None,
) -> tuple[Extractor, ExtractorUpdate | None]:
    """πϕ at inference over ``engine``, and its update when the method trains it (its weights resumed with
    the run, the rest by the ``Checkpointer``), on the placement's device, sharded over its torchrun group
    like the actor (every rank calls it then). Its unparseable answers go to
    ``out_dir/extractor_failures.jsonl``."""
    x = cfg.extractor
    update = None
    if cfg.extractor_trains:
        saved = state.path / EXTRACTOR_DIR if state is not None else None
        placement = placement or parallel.init_distributed(cfg.device, cfg.collective_timeout_s)
        model = load_extractor_model(x, saved)
        model = parallel.parallelize(model, placement, activation_checkpointing=x.gradient_checkpointing)
        update = ExtractorUpdate(frozen_in(model, placement.param_dtype), x)
    extractor = Extractor(
        engine,
        load_tokenizer(x.model_path),
        max_new_tokens=x.max_new_tokens,
        temperature=x.temperature,
        top_p=x.top_p,
        repetition_penalty=x.repetition_penalty,
        max_ops=x.max_ops,
        trajectory_chars=x.trajectory_chars,
        failure_log=Path(out_dir) / FAILURES_FILE if out_dir is not None else None,
        seed=cfg.seed,
    )
    return extractor, update


def join_group(cfg: RunConfig) -> parallel.Placement:
    """This process's device and place in its torchrun group, which must have ``cfg.nproc`` ranks."""
    placement = parallel.init_distributed(cfg.device, cfg.collective_timeout_s)
    if placement.world_size != cfg.nproc:
        raise ConfigError(
            f"nproc is {cfg.nproc} but this run was started as {placement.world_size} process(es): start it "
            f"with python -m trainer.train --nproc {cfg.nproc} (which launches torchrun), or set nproc to "
            "torchrun's total number of processes"
        )
    return placement


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
    cancel: CancelToken | None = None,
    clock: RunClock | None = None,
) -> tuple[Metrics, TrainingLoop]:
    """Train ``cfg``, writing checkpoints, ``metrics.jsonl`` and ``episodes.jsonl`` under ``out_dir``.

    ``resume``: a checkpoint folder or a run's out dir (its latest checkpoint); the config must equal the
    checkpoint's except ``steps``. ``store``: the run's experience bank, required by methods that use
    experience. ``engine`` / ``extractor_engine``: reuse running engines (re-synced first); by default they
    are built from the config and closed at the end. ``retrieve``: a retriever for plain loops (tests).
    ``cancel``: a token that stops the run within seconds once set (``loop.cancelled`` tells).
    ``clock``: the run's clock, saved in each checkpoint: the one a reporter stamps wall times with, started
    from the checkpoint's ``elapsed_s`` when resuming; by default one started so here.
    Returns the last metrics and the loop (its ``last_checkpoint``, ``model`` ...).
    """
    out_dir = Path(out_dir)
    make_mixture(cfg.env)  # an unknown env fails before anything loads
    placement = join_group(cfg)
    require_store(cfg, store)
    state = read_resume_point(cfg, resume, out_dir)
    tokenizer, _, actor = prepare_actor(cfg, out_dir, placement)
    with ExitStack() as owned:
        engine = owned_engine(owned, engine, build_engine, cfg)
        reporter = run_reporter(cfg, out_dir, reporter, owned)
        extractor = x_update = None
        if cfg.uses_experience:  # on every rank: vLLM's external launcher starts an engine with the group
            extractor_engine = owned_engine(owned, extractor_engine, build_extractor_engine, cfg)
            logs = out_dir if parallel.is_main() else None  # rank 0 logs πϕ's unparseable answers
            extractor, x_update = build_extractor(cfg, extractor_engine, state, logs, placement)
        checkpointer = Checkpointer(
            out_dir, cfg, actor, tokenizer, placement.distributed, extractor, x_update
        )
        resume_models(checkpointer, actor, state, engine)
        options = dict(retrieve=retrieve, store=store, cancel=cancel, clock=clock)
        loop = build_loop(cfg, state, checkpointer, actor, engine, reporter, **options)
        metrics = loop.run()
        if cfg.uses_experience:
            parallel.barrier()  # the helper ranks wait for rank 0's extractor work before the group ends
        return metrics, loop


def require_store(cfg: RunConfig, store: ExperienceStore | None) -> None:
    """A method that uses the experience bank needs its store on rank 0, where the bank lives."""
    if cfg.uses_experience and store is None and parallel.is_main():
        raise ConfigError(
            f"method {cfg.method!r} uses the experience bank, which needs the database: pass an experience "
            "store (manage.py train makes one)"
        )


def owned_engine(
    owned: ExitStack, given: Engine | None, build: Callable[[RunConfig], Engine], cfg: RunConfig
) -> Engine:
    """``given``, or an engine built here and closed when the run ends."""
    if given is not None:
        return given
    engine = build(cfg)
    owned.callback(engine.close)
    return engine


def run_reporter(cfg: RunConfig, out_dir: Path, given: Reporter | None, owned: ExitStack) -> Reporter:
    """Where the run reports: ``given`` (by default its files and the console) and the trackers the config
    names, closed when the run ends; on rank 0 alone, which writes files and reports."""
    if not parallel.is_main():
        return Reporters(BaseReporter())
    trackers = tracker_reporters(cfg, out_dir)
    for tracker in trackers:
        owned.callback(tracker.close)
    return Reporters(given or file_reporters(out_dir, ConsoleReporter()), *trackers)


def build_loop(
    cfg: RunConfig,
    state: CheckpointState | None,
    checkpointer: Checkpointer,
    actor: ActorUpdate,
    engine: Engine,
    reporter: Reporter,
    *,
    retrieve: Retriever | None,
    store: ExperienceStore | None,
    cancel: CancelToken | None,
    clock: RunClock | None,
) -> TrainingLoop:
    """This rank's loop: the plain ``TrainingLoop``; for a method that uses experience, rank 0's (or the
    one process's) ``CoevolutionLoop``, its extractor track resumed with the run, or a helper rank's."""
    common = dict(engine=engine, model=actor.model, tokenizer=checkpointer.tokenizer, reporter=reporter)
    common |= dict(out_dir=checkpointer.out_dir, actor=actor, checkpointer=checkpointer)
    common |= dict(start_step=state.step + 1 if state else 1, cancel=cancel or CancelToken())
    common |= dict(clock=clock or RunClock(state.elapsed_s if state else 0.0))
    if not cfg.uses_experience:
        return TrainingLoop(cfg, retrieve=retrieve, **common)
    common |= dict(extractor=checkpointer.extractor, extractor_update=checkpointer.extractor_update)
    if not parallel.is_main():  # plays free episodes, trains its shards of both models; πϕ's engine idles
        return HelperRankLoop(cfg, **common)
    loop = CoevolutionLoop(cfg, store=store, **common)
    checkpointer.attach_track(loop.track, state)
    return loop

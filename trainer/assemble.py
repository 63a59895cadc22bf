"""One place assembles a run (STYLE.md): read the config, build what its method needs, pick the loop.

    train(cfg, out_dir=..., store=...)   # every entry point: trainer.train (CLI), the Celery task,
                                         # manage.py train, the experiment runner

- every method: the actor (its model, tokenizer and update, resumed from a checkpoint if asked), the
  actor's rollout engine, the reporters;
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
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import parallel
from trainer.actor import ActorUpdate
from trainer.cancel import CancelToken
from trainer.checkpoint import (
    SHARDED_DIR,
    CheckpointState,
    check_resumable,
    load_checkpoint,
    load_sharded,
    load_sharded_checkpoint,
    read_checkpoint,
)
from trainer.coevolution import METRICS_FILE, STATE_FILE, CoevolutionLoop, HelperRankLoop, work_left
from trainer.config import ConfigError, ExtractorConfig, RunConfig
from trainer.envs.base import make_mixture
from trainer.extractor.model import Extractor
from trainer.extractor.update import ExtractorUpdate
from trainer.loop import Metrics, TrainingLoop
from trainer.lora import apply_lora, frozen_in, has_adapter, load_adapter
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
    cfg: RunConfig, out_dir: Path, state: CheckpointState | None, placement: parallel.Placement | None = None
) -> tuple[Any, Any, ActorUpdate]:
    """Write the run's config, seed, load the actor (and its optimiser state when resuming) onto the
    placement's device, sharded over its torchrun group if any (``trainer.parallel``)."""
    placement = placement or parallel.init_distributed(cfg.device)
    if parallel.is_main():
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    seed_everything(cfg.seed)
    tokenizer = load_tokenizer(cfg.actor.model_path)
    model = apply_lora(load_causal_lm(cfg.actor.model_path), cfg.actor.lora)
    model = parallel.parallelize(model, placement, activation_checkpointing=cfg.actor.gradient_checkpointing)
    model = frozen_in(model, placement.param_dtype)  # a LoRA actor's frozen base: bf16 on CUDA
    actor = ActorUpdate(model, cfg.actor, estimator=cfg.advantage_estimator)
    if state is not None:
        load = load_sharded_checkpoint if parallel.is_sharded(model) else load_checkpoint
        load(state, model=model, optimizer=actor.optimizer)
    return tokenizer, model, actor


def sync_if_stale(actor: ActorUpdate, engine: Engine, state: CheckpointState | None) -> None:
    """The engine must serve the actor's weights: after a resume, or when it served another run before."""
    if state is not None or engine.weight_version != 0:
        actor.sync(engine, max(engine.weight_version, state.engine_version if state else 0) + 1)


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
    """πϕ at inference over ``engine``, and its update when the method trains it (resumed with the run),
    on the placement's device, sharded over its torchrun group like the actor (every rank calls it then).
    Its unparseable answers go to ``out_dir/extractor_failures.jsonl``."""
    x = cfg.extractor
    update = None
    if cfg.extractor_trains:
        saved = state.path / "extractor" if state is not None else None
        placement = placement or parallel.init_distributed(cfg.device)
        model = load_extractor_model(x, saved)
        model = parallel.parallelize(model, placement, activation_checkpointing=x.gradient_checkpointing)
        update = ExtractorUpdate(frozen_in(model, placement.param_dtype), x)
        if saved is not None and parallel.is_sharded(update.model):  # its AdamW state, resharded
            load_sharded(saved / SHARDED_DIR, update.model, update.optimizer)
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
    )
    if update is not None and (engine.weight_version != 0 or state is not None):
        update.sync(extractor)
    return extractor, update


def join_group(cfg: RunConfig) -> parallel.Placement:
    """This process's device and place in its torchrun group, which must have ``cfg.nproc`` ranks."""
    placement = parallel.init_distributed(cfg.device)
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
    if cfg.uses_experience and store is None and parallel.is_main():  # the bank lives on rank 0 alone
        raise ConfigError(
            f"method {cfg.method!r} uses the experience bank, which needs the database: pass an experience "
            "store (manage.py train makes one)"
        )
    state = read_resume_point(cfg, resume, out_dir)
    tokenizer, model, actor = prepare_actor(cfg, out_dir, state, placement)
    if not parallel.is_main():  # rank 0 alone writes files and reports
        reporter = BaseReporter()
    with ExitStack() as owned:
        if engine is None:
            engine = build_engine(cfg)
            owned.callback(engine.close)
        sync_if_stale(actor, engine, state)
        trackers = tracker_reporters(cfg, out_dir) if parallel.is_main() else []
        for tracker in trackers:
            owned.callback(tracker.close)
        common = dict(
            engine=engine,
            model=model,
            tokenizer=tokenizer,
            out_dir=out_dir,
            reporter=Reporters(reporter or file_reporters(out_dir, ConsoleReporter()), *trackers),
            actor=actor,
            start_step=state.step + 1 if state else 1,
            cancel=cancel or CancelToken(),
            clock=clock or RunClock(state.elapsed_s if state else 0.0),
        )
        if not cfg.uses_experience:
            loop = TrainingLoop(cfg, retrieve=retrieve, **common)
            return loop.run(), loop
        if extractor_engine is None:
            # on every rank: vLLM's external launcher starts an engine with the whole group (a collective)
            extractor_engine = build_extractor_engine(cfg)
            owned.callback(extractor_engine.close)
        if parallel.is_main():
            loop = coevolution_loop(cfg, state, store, extractor_engine, placement, **common)
        else:  # a helper rank: plays free episodes, trains its shards of both models; πϕ's engine idles
            extractor, x_update = build_extractor(cfg, extractor_engine, state, placement=placement)
            loop = HelperRankLoop(cfg, extractor=extractor, extractor_update=x_update, **common)
        metrics = loop.run()
        parallel.barrier()  # the helper ranks wait for rank 0's extractor work before the group ends
        return metrics, loop


def coevolution_loop(
    cfg: RunConfig,
    state: CheckpointState | None,
    store: ExperienceStore,
    extractor_engine: Engine,
    placement: parallel.Placement,
    **common,
) -> CoevolutionLoop:
    """Rank 0's (or the one process's) loop of a method that uses experience: πϕ over its engine, trained
    when the method trains it, with the extractor track's state when resuming."""
    extractor, x_update = build_extractor(cfg, extractor_engine, state, common["out_dir"], placement)
    loop = CoevolutionLoop(cfg, store=store, extractor=extractor, extractor_update=x_update, **common)
    if state is not None and (state.path / "extractor" / STATE_FILE).exists():
        loop.track.load_state_dict(torch.load(state.path / "extractor" / STATE_FILE, weights_only=False))
    return loop

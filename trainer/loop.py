"""The actor's training loop in short phases (docs/design.md §3.4, §8):

sample task instances → rollout (retrieval inside, for guided episodes) → score → advantages and actor
update → weight sync → report; evaluate every ``eval_every`` steps on the env's frozen eval split through
the same runner with greedy decoding; checkpoint every ``checkpoint_every`` steps, after every evaluation,
once ``checkpoint_minutes`` have passed since the last one, and at the end. A set ``cancel`` token stops the
loop at its next cancellation point (``trainer.cancel``) with neither evaluation nor checkpoint.

The background extractor track (docs/design.md §3.4) runs beside this loop and never blocks it; it reaches
the loop only through the ``retrieve`` callable and the reporter's episode batches (``trainer.coevolution``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer import parallel
from trainer.actor import ActorUpdate
from trainer.cancel import Cancelled, CancelToken
from trainer.checkpoint import Checkpointer
from trainer.config import RunConfig
from trainer.envs.base import make_mixture
from trainer.evaluate import evaluate
from trainer.memory import release_freed_memory, resident_gib
from trainer.metrics import Metrics
from trainer.report import Progress, Reporter, RunClock, report_eval_episodes
from trainer.rollout.base import Engine
from trainer.rollout.runner import (
    Episode,
    EpisodeRunner,
    EpisodeSpec,
    Retriever,
    RolloutStats,
    ShardedRunner,
)


def sample_tasks(cfg: RunConfig, step: int) -> list[EpisodeSpec]:
    """The episodes of ``step``: ``tasks_per_step`` task instances × K rollouts (guided half first).

    Derived from (seed, step) alone, so a resumed run samples exactly what the uninterrupted run would.
    """
    mixture = make_mixture(cfg.env)
    rng = random.Random(f"{cfg.seed}/tasks/{step}")
    specs = []
    for group in range(cfg.tasks_per_step):
        env_name, seed = mixture.sample(rng), rng.randrange(2**31)
        for k in range(cfg.k_rollouts):
            sample_seed = random.Random(f"{cfg.seed}/sample/{step}/{group}/{k}").randrange(2**31)
            specs.append(EpisodeSpec(env_name, seed, group, k < cfg.guided_per_task, sample_seed))
    return specs


def episode_metrics(episodes: Sequence[Episode], prefix: str) -> Metrics:
    """Success rate, mean reward, mean actions, invalid-action and truncation rates of ``episodes``."""
    n = max(len(episodes), 1)
    turns = [t for e in episodes for t in e.turns]
    return {
        f"{prefix}success": sum(e.success for e in episodes) / n,
        f"{prefix}reward": sum(e.reward for e in episodes) / n,
        f"{prefix}actions": sum(e.num_actions for e in episodes) / n,
        f"{prefix}invalid_frac": sum(t.invalid for t in turns) / max(len(turns), 1),
        f"{prefix}truncated_frac": sum(e.truncated for e in episodes) / n,
        f"{prefix}episodes": float(len(episodes)),
    }


def batch_metrics(episodes: Sequence[Episode], prefix: str, envs: Sequence[str] = ()) -> Metrics:
    """``episode_metrics`` of the batch, and per env (``<prefix><env>/``) for mixtures (``envs``: its envs;
    an env the step did not sample has no keys)."""
    metrics = episode_metrics(episodes, prefix)
    for name in envs if len(envs) > 1 else ():
        mine = [e for e in episodes if e.spec.env_name == name]
        if mine:
            metrics |= episode_metrics(mine, f"{prefix}{name}/")
    return metrics


def score(episodes: Sequence[Episode], envs: Sequence[str] = ()) -> Metrics:
    """Training-batch metrics, split into guided and free halves when both are present, per env of a
    mixture as well (``train/<env>/success``, ``train/guided/<env>/success``, as eval names them)."""
    metrics = batch_metrics(episodes, "train/", envs)
    guided = [e for e in episodes if e.spec.guided]
    if guided and len(guided) < len(episodes):
        metrics |= batch_metrics(guided, "train/guided/", envs)
        metrics |= batch_metrics([e for e in episodes if not e.spec.guided], "train/free/", envs)
    return metrics


@dataclass
class TrainingLoop:
    """Everything one run's actor loop needs; ``run()`` trains from ``start_step`` to ``cfg.steps``."""

    cfg: RunConfig
    engine: Engine
    model: torch.nn.Module
    tokenizer: Any
    out_dir: Path
    reporter: Reporter
    actor: ActorUpdate
    checkpointer: Checkpointer
    """Writes the run's checkpoints (``trainer.checkpoint``); the loop decides when."""
    start_step: int = 1
    retrieve: Retriever | None = None
    cancel: CancelToken = field(default_factory=CancelToken)
    clock: RunClock = field(default_factory=RunClock)
    """Seconds the run has trained, saved in each checkpoint; a resumed run's goes on from its checkpoint."""
    eval_retrieve: Retriever | None = field(default=None, init=False)
    """The retriever of the evaluation's column with experience (none: only the column without)."""

    def __post_init__(self) -> None:
        r = self.cfg.rollout
        options = dict(max_new_tokens=r.max_new_tokens, top_p=r.top_p, turn_limit=r.turn_limit)
        options |= dict(context_tokens=r.context_tokens, cancel=self.cancel)
        options |= dict(experience_placement=self.cfg.experience.placement)
        self.actor.cancel = self.cancel
        self.cancelled = False
        self.checkpointed_at = time.monotonic()
        # each rank of a torchrun group plays its share of the episodes and receives all of them
        train = EpisodeRunner(self.engine, self.tokenizer, temperature=r.temperature, **options)
        self.runner = ShardedRunner(train)
        self.eval_runner = ShardedRunner(EpisodeRunner(self.engine, self.tokenizer, split="eval", **options))
        self.last_checkpoint: Path | None = None
        self.progress = Progress(self.reporter)
        self.actor.progress = self.progress.advance

    def run(self) -> Metrics:
        """Train; returns the last step's metrics merged with the last evaluation's."""
        cfg = self.cfg
        self.reporter.on_start(cfg.steps, self.start_step)
        last: Metrics = {}
        try:
            if self.start_step == 1:
                last |= self.evaluate(0)
            for step in range(self.start_step, cfg.steps + 1):
                last |= self.train_step(step)
                self.cancel.check()
                stopping = parallel.any_rank(self.reporter.should_stop())  # every rank stops together
                evaluates = step == cfg.steps or stopping or (cfg.eval_every and step % cfg.eval_every == 0)
                if evaluates:
                    last |= self.evaluate(step)
                if evaluates or self.checkpoint_due(step):
                    self.checkpoint(step)
                if stopping:
                    break
        except Cancelled:
            self.cancelled = True
        finally:
            self.runner.close()
            self.eval_runner.close()
        return last

    def checkpoint_due(self, step: int) -> bool:
        every, minutes = self.cfg.checkpoint_every, self.cfg.checkpoint_minutes
        overdue = minutes > 0 and time.monotonic() - self.checkpointed_at >= 60 * minutes
        return bool(every and step % every == 0) or parallel.any_rank(overdue)  # clocks differ by rank

    def train_step(self, step: int) -> Metrics:
        t0 = time.perf_counter()
        specs = sample_tasks(self.cfg, step)
        self.progress.start(step, "rollouts", "episodes", len(specs))
        episodes, stats = self.runner.run(specs, retrieve=self.retrieve, progress=self.progress.advance)
        metrics = score(episodes, make_mixture(self.cfg.env).names) | stats.as_metrics()
        metrics["time/rollout_s"] = stats.wall_s
        if self.cfg.actor_trains:
            self.progress.start(step, "actor update", "micro-batches")
            with self.engine.asleep():  # on CUDA the engine's memory is the trainer's while it steps
                metrics |= self.actor.step(episodes)
            self.progress.start(step, "weight sync")
            metrics["time/sync_s"] = self.actor.sync(self.engine, self.engine.weight_version + 1)
        metrics["engine/weight_version"] = float(self.engine.weight_version)
        metrics["time/step_s"] = time.perf_counter() - t0
        release_freed_memory()
        metrics["memory/rss_gib"] = resident_gib()
        metrics |= self.rank_metrics(stats, metrics["memory/rss_gib"])
        self.reporter.on_episode_batch(step, episodes)
        self.reporter.on_step(step, metrics)
        return metrics

    def rank_metrics(self, stats: RolloutStats, rss_gib: float) -> Metrics:
        """What each rank of a torchrun group did in the step (``rank/<r>/...``: episodes it played, how many
        of them guided, their tokens per second, its resident memory), for the run page's per-process table;
        nothing on one process. Every rank calls it (a collective)."""
        tokens_per_s = stats.generated_tokens / max(stats.wall_s, 1e-9)
        mine = {"episodes": float(stats.played), "guided": float(stats.played_guided)}
        mine |= {"tokens_per_s": tokens_per_s, "rss_gib": rss_gib}
        ranks = parallel.gather_values(mine)
        if len(ranks) == 1:
            return {}
        return {f"rank/{r}/{k}": v for r, values in enumerate(ranks) for k, v in values.items()}

    def evaluate(self, step: int) -> Metrics:
        """Greedy episodes on the first ``eval_episodes`` instances of each env's eval split."""
        self.progress.start(step, "evaluation", "episodes")
        metrics = evaluate(
            self.eval_runner,
            self.cfg.env,
            self.cfg.eval_episodes,
            retrieve=self.eval_retrieve,
            progress=self.progress.advance,
            on_episodes=lambda episodes: report_eval_episodes(self.reporter, step, episodes),
        )
        release_freed_memory()
        self.reporter.on_eval(step, metrics)
        return metrics

    def checkpoint(self, step: int) -> Path:
        """Every rank saves its part (``Checkpointer.save``)."""
        self.progress.start(step, "checkpoint")
        version, elapsed = self.engine.weight_version, self.clock()
        self.last_checkpoint = self.checkpointer.save(step, engine_version=version, elapsed_s=elapsed)
        self.checkpointed_at = time.monotonic()
        return self.last_checkpoint

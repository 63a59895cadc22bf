"""The actor update (docs/design.md §3.1): split GRPO advantages, PPO-clip over the actor's own tokens, AdamW.

One call of ``ActorUpdate.step(episodes)`` is one optimiser step over a batch of finished episodes:

1. advantages per task instance, guided and free halves normalised separately (``losses`` estimator);
2. π_old: one optimiser step per batch means π_old = π_θ, so the training forward's own log-probs,
   detached, are π_old (ratio ≡ 1, the gradient is the policy gradient); a separate no-grad recompute
   runs only with ``recompute_old_logprobs``. The engine's own log-probs are not used as π_old: the
   engine may run bf16 (off by ~0.02-0.07 per token from the fp32 trainer), and the ratio must compare
   the trainer's model with itself. They are kept only to measure the
   engine-trainer mismatch (``actor/engine_logp_diff``), which also catches an engine serving stale
   weights;
3. PPO-clip token loss over masked tokens, accumulated over micro-batches, grad-norm clip, AdamW (the loop
   both trainers share, ``trainer.update``, which skips a step whose gradient norm is not finite).

**Episodes are the trajectories.** An episode may span several training segments (see
``trainer.rollout.runner``); every aggregation mode is computed per episode, then written as per-segment
weights on token sums, so micro-batches and segments add up to exactly the full-batch loss:

- seq-mean-token-mean: L = Σ_e w_e · (1/n_e) Σ_{t∈e} l_t, with w_e = ``subgroup_weights`` (½ Σ_c mean_c);
- seq-mean-token-sum:  L = Σ_e w_e Σ_{t∈e} l_t;
- token-mean:          L = (1/N) Σ_t l_t over all trained tokens of the batch.

**Many ranks** (``trainer.parallel``): every rank receives the whole batch, so these weights are global,
and trains on its share of the rows; the ranks' losses add up to the full-batch loss and FSDP sums their
gradients. A rank left without a row for a micro-batch runs one with its loss times 0, so collectives
stay matched. Batches go to the model's device.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer import losses, parallel
from trainer.config import ActorConfig
from trainer.lora import served_state_dict
from trainer.metrics import Metrics
from trainer.rollout.base import Engine, sequence_logprobs
from trainer.rollout.runner import Episode, Segment
from trainer.update import MicroBatch, MicroBatchLoss, PolicyUpdate, pad_rows


class StaleWeightsError(RuntimeError):
    """The rollout engine's log-probs disagree with the trainer's far beyond dtype noise."""


@dataclass
class _Row:
    """One training sequence: a segment of episode ``episode``, its advantage and its loss weight."""

    segment: Segment
    episode: int
    adv: float
    weight: float


def episode_advantages(
    episodes: Sequence[Episode], estimator: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Metrics]:
    """Advantages (E,) from episode rewards, grouped by task instance and guided/free subgroup.

    Returns (adv, group_ids, guided, metrics).
    """
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float32)
    group_ids = torch.tensor([e.spec.group for e in episodes], dtype=torch.long)
    guided = torch.tensor([e.spec.guided for e in episodes], dtype=torch.bool)
    adv, metrics = losses.get_adv_estimator(estimator)(rewards, group_ids, guided)
    return adv, group_ids, guided, metrics


def training_rows(
    episodes: Sequence[Episode], adv: torch.Tensor, group_ids: torch.Tensor, guided: torch.Tensor, agg: str
) -> list[_Row]:
    """Every segment with trained tokens, weighted so that Σ_rows weight · Σ_t l_t is the ``agg`` loss."""
    n_tok = torch.tensor([sum(s.num_trained for s in e.segments) for e in episodes], dtype=torch.float32)
    if agg == "token-mean":
        ep_weight = torch.full_like(n_tok, 1.0 / max(float(n_tok.sum()), 1.0))
    else:
        has = n_tok > 0
        w = torch.zeros_like(n_tok)
        if has.any():
            w[has] = losses.subgroup_weights(guided[has], group_ids[has])
        ep_weight = w / n_tok.clamp(min=1) if agg == "seq-mean-token-mean" else w
    return [
        _Row(seg, i, float(adv[i]), float(ep_weight[i]))
        for i, e in enumerate(episodes)
        for seg in e.segments
        if seg.num_trained
    ]


class ActorUpdate(PolicyUpdate[_Row, ActorConfig]):
    """Owns the actor's optimiser; ``step`` is one PPO-clip update, ``sync`` pushes weights to an engine."""

    name = "actor"

    def __init__(
        self, model: torch.nn.Module, cfg: ActorConfig, *, estimator: str, max_engine_diff: float = 1.0
    ):
        """``estimator``: the run's advantage estimator (``RunConfig.advantage_estimator``).
        ``max_engine_diff``: mean |engine - trainer| log-prob above which the engine is declared stale."""
        super().__init__(model, cfg, max_engine_diff=max_engine_diff)
        self.estimator = estimator

    def step(self, episodes: Sequence[Episode]) -> Metrics:
        """One optimiser step on ``episodes`` (one epoch, as the paper). Returns plain-float metrics."""
        adv, group_ids, guided, metrics = episode_advantages(episodes, self.estimator)
        every = training_rows(episodes, adv, group_ids, guided, self.cfg.aggregation)
        rows = sorted(self._live(every), key=lambda r: r.segment.num_ids)  # less padding
        metrics["actor/skipped_rows"] = float(len(every) - len(rows))
        mbs = self._micro_batches(rows)
        t0 = time.perf_counter()
        mbs = self._recompute_old_logp(mbs)
        metrics["time/recompute_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        trained = self._forward_backward(mbs, self._loss)
        # the stale-engine check runs every step, before the weights change: on one skipped row when no
        # row has signal
        checked = (
            [(t.items, t.logp) for t in trained]
            if rows or not every
            else [(every[:1], self._old_logp(every[:1]))]
        )
        metrics |= self._engine_mismatch(checked)
        metrics |= self._finish(trained, stepped=bool(rows))
        metrics["time/backward_s"] = time.perf_counter() - t0
        metrics["actor/tokens"] = float(sum(r.segment.num_trained for r in rows))
        metrics["actor/sequences"] = float(len(rows))  # the whole batch's, on every rank
        return metrics

    def sync(self, engine: Engine, version: int) -> float:
        """Push the actor's weights to ``engine`` stamped ``version``; returns the seconds it took."""
        t0 = time.perf_counter()
        engine.update_weights(served_state_dict(self.model), version)  # LoRA: the merged weights
        return time.perf_counter() - t0

    # ---- pieces ------------------------------------------------------------------------------

    def _recompute_old_logp(self, mbs: list[MicroBatch[_Row]]) -> list[MicroBatch[_Row]]:
        """π_old by a separate no-grad pass, only when asked for (``recompute_old_logprobs``, e.g. for several
        optimiser steps per batch). With one optimiser step per batch π_old is π_θ, so the training
        forward's own log-probs, detached, are π_old and the ratio is exactly 1 (as verl does on-policy)."""
        if not self.cfg.recompute_old_logprobs:
            return mbs
        return [dataclasses.replace(mb, old_logp=self._old_logp(mb.items)) for mb in mbs]

    def _loss(self, mb: MicroBatch[_Row]) -> MicroBatchLoss:
        """The policy loss of a micro-batch. The row weights already carry the aggregation (see the module
        docstring): tokens are summed, rows weighted."""
        logp = pad_rows(self._logp(mb.items), self.device)  # (B, T) over response ids
        old_logp = logp.detach() if mb.old_logp is None else mb.old_logp
        mask = pad_rows([r.segment.mask for r in mb.items], self.device)
        loss, metrics = self.policy_loss(
            logp,
            old_logp,
            torch.tensor([r.adv for r in mb.items], device=self.device),
            mask,
            eps_low=self.cfg.clip_eps,
            eps_high=self.cfg.clip_eps,
            agg="seq-mean-token-sum",
            seq_weights=torch.tensor([r.weight for r in mb.items], device=self.device),
        )
        return MicroBatchLoss(loss, mask, old_logp, metrics)

    def _logp(self, mb: Sequence[_Row]) -> list[torch.Tensor]:
        segs = [r.segment for r in mb]
        with parallel.autocast(self.model):
            return sequence_logprobs(
                self.model,
                [s.prompt_ids for s in segs],
                [s.response_ids for s in segs],
                batch_size=len(segs),
                masks=[s.mask for s in segs],
            )

    @torch.no_grad()
    def _old_logp(self, mb: Sequence[_Row]) -> torch.Tensor:
        self.model.eval()
        return pad_rows(self._logp(mb), self.device)

    def _engine_mismatch(self, checked: list[tuple[list[_Row], torch.Tensor]]) -> Metrics:
        """Mean |engine - trainer| log-prob over the rows ``checked`` (with their π_old); raises
        ``StaleWeightsError`` far beyond dtype noise."""
        diffs = [torch.zeros(0)]
        for mb, mb_old in checked:
            for i, r in enumerate(mb):
                m = torch.tensor(r.segment.mask, dtype=torch.bool)
                engine = torch.tensor(r.segment.engine_logprobs)[m]
                diffs.append((engine - mb_old[i, : len(m)].cpu()[m]).abs())
        diff = torch.cat(diffs)
        # every rank judges the whole batch, so all raise or none does
        total, count = parallel.all_sum([float(diff.sum()), diff.numel()], self.model)
        top = parallel.all_max(float(diff.max()) if diff.numel() else 0.0, self.model)
        if not count:
            return {}
        mean = total / count
        if mean > self.max_engine_diff:
            raise StaleWeightsError(
                f"rollout engine log-probs differ from the trainer's by {mean:.3f} per token on average "
                f"(limit {self.max_engine_diff}): the engine is not serving the actor's weights"
            )
        return {"actor/engine_logp_diff": mean, "actor/engine_logp_diff_max": top}

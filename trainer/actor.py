"""The actor update (DESIGN §3.1): split GRPO advantages, PPO-clip over the actor's own tokens, AdamW.

One call of ``ActorUpdate.step(episodes)`` is one optimiser step over a batch of finished episodes:

1. advantages per task instance, guided and free halves normalised separately (``losses`` estimator);
2. π_old: one optimiser step per batch means π_old = π_θ, so the training forward's own log-probs,
   detached, are π_old (ratio ≡ 1, the gradient is the policy gradient); a separate no-grad recompute
   runs only with ``recompute_old_logprobs``. The engine's own log-probs are not used as π_old: the
   engine may run bf16 (off by ~0.02-0.07 per token from the fp32 trainer), and the ratio must compare
   the trainer's model with itself. They are kept only to measure the
   engine-trainer mismatch (``actor/engine_logp_diff``), which also catches an engine serving stale
   weights;
3. PPO-clip token loss over masked tokens, accumulated over micro-batches, grad-norm clip, AdamW.

**Episodes are the trajectories.** An episode may span several training segments (see
``trainer.rollout.runner``); every aggregation mode is computed per episode, then written as per-segment
weights on token sums, so micro-batches and segments add up to exactly the full-batch loss:

- seq-mean-token-mean: L = Σ_e w_e · (1/n_e) Σ_{t∈e} l_t, with w_e = ``subgroup_weights`` (½ Σ_c mean_c);
- seq-mean-token-sum:  L = Σ_e w_e Σ_{t∈e} l_t;
- token-mean:          L = (1/N) Σ_t l_t over all trained tokens of the batch.

**Many ranks** (``trainer.parallel``): every rank receives the whole batch, so these weights are global,
and trains on its share of the rows; the ranks' losses add up to the full-batch loss and FSDP sums their
gradients. A rank left without a row for a micro-batch runs one weighted 0, so collectives stay matched.
Batches go to the model's device.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainer import losses, memory, parallel
from trainer.cancel import CancelToken
from trainer.config import ActorConfig
from trainer.lora import served_state_dict
from trainer.rollout.base import Engine, sequence_logprobs
from trainer.rollout.runner import Episode, Segment

Metrics = dict[str, float]


class StaleWeightsError(RuntimeError):
    """The rollout engine's log-probs disagree with the trainer's far beyond dtype noise."""


@dataclass
class _Row:
    """One training sequence: a segment of episode ``episode``, its advantage and its loss weight."""

    segment: Segment
    episode: int
    adv: float
    weight: float


def _pad(rows: Sequence[Sequence[float]] | Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    B, T = len(rows), max(len(r) for r in rows)
    out = torch.zeros(B, T, dtype=torch.float32, device=device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32, device=device)
    return out


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


class ActorUpdate:
    """Owns the actor's optimiser; ``step`` is one PPO-clip update, ``sync`` pushes weights to an engine."""

    def __init__(
        self, model: torch.nn.Module, cfg: ActorConfig, *, estimator: str, max_engine_diff: float = 1.0
    ):
        """``estimator``: the run's advantage estimator (``RunConfig.advantage_estimator``).
        ``max_engine_diff``: mean |engine - trainer| log-prob above which the engine is declared stale."""
        self.model = model
        self.device = parallel.model_device(model)
        self.cfg = cfg
        self.estimator = estimator
        self.max_engine_diff = max_engine_diff
        self.policy_loss = losses.get_policy_loss(cfg.policy_loss)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.cancel = CancelToken()
        """Checked between micro-batches; the loop hands it its own token."""
        self.progress: Callable[[int, int], None] | None = None
        """Gets (micro-batches done, micro-batches) during ``step``; the loop sets it."""
        # a sharded model got its checkpointing from ``parallel.parallelize``
        if (
            cfg.gradient_checkpointing
            and hasattr(model, "gradient_checkpointing_enable")
            and not parallel.is_sharded(model)
        ):
            model.gradient_checkpointing_enable()

    def step(self, episodes: Sequence[Episode]) -> Metrics:
        """One optimiser step on ``episodes`` (one epoch, as the paper). Returns plain-float metrics."""
        adv, group_ids, guided, metrics = episode_advantages(episodes, self.estimator)
        every = training_rows(episodes, adv, group_ids, guided, self.cfg.aggregation)
        # a zero-advantage row adds exactly nothing to the loss or its gradient (every policy loss is
        # linear in A): skip its forward and backward. A step with no signal at all takes no optimiser step.
        rows = sorted((r for r in every if r.adv != 0.0), key=lambda r: r.segment.num_ids)  # less padding
        metrics["actor/skipped_rows"] = float(len(every) - len(rows))
        mbs = parallel.rank_micro_batches(rows, self.cfg.micro_batch_size, *parallel.trainers_of(self.model))
        # a rank with nothing left still joins the sharded forward and backward: one row, weighted 0
        fillers = [not mb for mb in mbs]
        mbs = [mb or [dataclasses.replace(rows[0], weight=0.0)] for mb in mbs]

        t0 = time.perf_counter()
        # one optimiser step per batch: π_old is π_θ, so the training forward's own log-probs (detached) are
        # π_old and the ratio is exactly 1 (as verl does on-policy). The separate no-grad pass is only run
        # when asked for (``recompute_old_logprobs``), e.g. for several optimiser steps per batch.
        recomputed = [self._old_logp(mb) for mb in mbs] if self.cfg.recompute_old_logprobs else None
        metrics["time/recompute_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss, n_tok = 0.0, 0
        sums = {"clip_frac": 0.0, "approx_kl": 0.0}
        old: list[torch.Tensor] = []
        for i, mb in enumerate(mbs):
            self.cancel.check()
            with memory.ONE_PASS:  # never beside πϕ's activations (trainer.memory)
                logp = _pad(self._logp(mb), self.device)  # (B, T) over response ids
                old.append(recomputed[i] if recomputed is not None else logp.detach())
                mask = _pad([r.segment.mask for r in mb], self.device)
                mb_adv = torch.tensor([r.adv for r in mb], device=self.device)
                mb_w = torch.tensor([r.weight for r in mb], device=self.device)
                # weights already carry the aggregation (see module docstring): sum tokens, weight rows
                loss, m = self.policy_loss(
                    logp,
                    old[-1],
                    mb_adv,
                    mask,
                    eps_low=self.cfg.clip_eps,
                    eps_high=self.cfg.clip_eps,
                    agg="seq-mean-token-sum",
                    seq_weights=mb_w,
                )
                loss.backward()
            if self.progress is not None:
                self.progress(i + 1, len(mbs))
            if fillers[i]:
                continue
            k = int(mask.sum())
            total_loss += loss.item()
            n_tok += k
            for name in sums:
                sums[name] += m[name] * k
        # the stale-engine check runs every step, before the weights change: on one skipped row when no
        # row has signal
        real = [i for i, filler in enumerate(fillers) if not filler]
        checked = (
            ([mbs[i] for i in real], [old[i] for i in real])
            if mbs or not every
            else ([every[:1]], [self._old_logp(every[:1])])
        )
        metrics |= self._engine_mismatch(*checked)
        total_loss, n_tok, *summed = parallel.all_sum([total_loss, n_tok, *sums.values()], self.model)
        sums = dict(zip(sums, summed, strict=True))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if rows:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics["time/backward_s"] = time.perf_counter() - t0
        metrics |= {
            "actor/loss": total_loss,
            "actor/clip_frac": sums["clip_frac"] / max(n_tok, 1),
            "actor/approx_kl": sums["approx_kl"] / max(n_tok, 1),
            "actor/grad_norm": float(parallel.full_tensor(grad_norm)),
            "actor/tokens": float(n_tok),
            "actor/sequences": float(len(rows)),  # the whole batch's, on every rank
        }
        return metrics

    def sync(self, engine: Engine, version: int) -> float:
        """Push the actor's weights to ``engine`` stamped ``version``; returns the seconds it took."""
        t0 = time.perf_counter()
        engine.update_weights(served_state_dict(self.model), version)  # LoRA: the merged weights
        return time.perf_counter() - t0

    # ---- pieces ------------------------------------------------------------------------------

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
        return _pad(self._logp(mb), self.device)

    def _engine_mismatch(self, mbs: list[list[_Row]], old: list[torch.Tensor]) -> Metrics:
        diffs = [torch.zeros(0)]
        for mb, mb_old in zip(mbs, old, strict=True):
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

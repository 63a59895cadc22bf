"""The policy update both trainers share (docs/design.md §3.1, §3.2): one optimiser step over a batch.

As in verl's ``dp_actor``, the loop is written once and the trainers supply what differs: the actor
(``trainer.actor``) trains episode segments with PPO-clip, πϕ (``trainer.extractor.update``) its
generations with CISPO; each gives the loss of one micro-batch and judges its own engine. The loop:

- only items with a non-zero advantage run: every policy loss is linear in A, so the others add exactly
  nothing to the loss or its gradient, and a batch with none takes no optimiser step;
- each rank trains its share of the items (``parallel.rank_micro_batches``); a rank with nothing left for a
  micro-batch still joins the sharded forward and backward, on one item with its loss times 0, so the
  collectives stay matched;
- one micro-batch's forward and backward at a time in the process (``memory.ONE_PASS``), the cancel token
  checked before each;
- loss and tokens summed over ranks, ``clip_frac`` and ``approx_kl`` averaged over the trained tokens;
- the gradient norm clipped, then AdamW. A norm that is not finite (one NaN or inf row poisons the whole
  sum) skips the step: weights and optimiser state stay as they were, a warning is logged and
  ``<name>/nonfinite_grad_steps`` reads 1.

Batches go to the model's device.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

import torch

from trainer import losses, memory, parallel
from trainer.cancel import CancelToken
from trainer.config import ActorConfig, ExtractorConfig
from trainer.metrics import Metrics

log = logging.getLogger(__name__)


class Scored(Protocol):
    """A training item: it carries its advantage."""

    adv: float


Item = TypeVar("Item", bound=Scored)
Config = TypeVar("Config", ActorConfig, ExtractorConfig)


@dataclass
class MicroBatch(Generic[Item]):
    """One micro-batch of this rank's share."""

    items: list[Item]
    filler: bool = False
    """This rank had nothing left for it: ``items`` is one item, trained with its loss times 0."""
    old_logp: torch.Tensor | None = None
    """(B, T) π_old recomputed before the pass; None: the pass's own log-probs, detached, are π_old."""


@dataclass
class MicroBatchLoss:
    """What a trainer's loss gives for one micro-batch."""

    loss: torch.Tensor
    """This micro-batch's share of the full-batch loss (a scalar with its graph)."""
    mask: torch.Tensor
    """(B, T): 1 on the tokens trained."""
    logp: torch.Tensor
    """(B, T), detached: the trainer's log-probs that the engine's are checked against."""
    metrics: Metrics
    """The policy loss's own (``clip_frac``, ``approx_kl``, …)."""


@dataclass
class Trained(Generic[Item]):
    """A micro-batch this rank trained (a filler is not one), reduced to what the step reports."""

    items: list[Item]
    logp: torch.Tensor
    loss: float
    tokens: int
    metrics: Metrics


def pad_rows(
    rows: Sequence[Sequence[float]] | Sequence[torch.Tensor], device: torch.device, width: int | None = None
) -> torch.Tensor:
    """Right-pad rows of floats with 0 into a (B, T) float32 tensor on ``device``; T = ``width`` or the
    longest row. Assigning a tensor keeps its gradient."""
    B, T = len(rows), width if width is not None else max(len(r) for r in rows)
    out = torch.zeros(B, T, dtype=torch.float32, device=device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32, device=device)
    return out


class PolicyUpdate(Generic[Item, Config]):
    """Owns a trainer model's optimiser and the loop of one update; subclasses supply the loss."""

    name: ClassVar[str]
    """The metrics' prefix (``actor``, ``extractor``)."""

    def __init__(self, model: torch.nn.Module, cfg: Config, *, max_engine_diff: float = 1.0) -> None:
        """``max_engine_diff``: mean |engine - trainer| log-prob above which the engine is declared stale."""
        self.model = model
        self.device = parallel.model_device(model)
        self.cfg = cfg
        self.max_engine_diff = max_engine_diff
        self.policy_loss = losses.get_policy_loss(cfg.policy_loss)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.cancel = CancelToken()
        """Checked between micro-batches; the loop hands it its own token."""
        self.progress: Callable[[int, int], None] | None = None
        """Gets (micro-batches done, micro-batches) during a step; the loop sets it."""
        parallel.enable_gradient_checkpointing(model, cfg.gradient_checkpointing)

    @staticmethod
    def _live(items: Sequence[Item]) -> list[Item]:
        """The items with signal: a zero advantage adds exactly nothing to any policy loss or gradient."""
        return [item for item in items if item.adv != 0.0]

    def _micro_batches(self, items: Sequence[Item]) -> list[MicroBatch[Item]]:
        """This rank's share of ``items``, as many micro-batches as every other rank's."""
        shares = parallel.rank_micro_batches(
            items, self.cfg.micro_batch_size, *parallel.trainers_of(self.model)
        )
        return [MicroBatch(share or list(items[:1]), filler=not share) for share in shares]

    def _forward_backward(
        self, mbs: Sequence[MicroBatch[Item]], loss_of: Callable[[MicroBatch[Item]], MicroBatchLoss]
    ) -> list[Trained[Item]]:
        """Accumulate the gradients of ``mbs``; returns the micro-batches trained (not the fillers)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        trained = []
        for i, mb in enumerate(mbs):
            self.cancel.check()
            with memory.ONE_PASS:  # never beside the other trainer's activations (trainer.memory)
                out = loss_of(mb)
                (out.loss * 0.0 if mb.filler else out.loss).backward()
            if self.progress is not None:
                self.progress(i + 1, len(mbs))
            if not mb.filler:
                trained.append(Trained(mb.items, out.logp, out.loss.item(), int(out.mask.sum()), out.metrics))
        return trained

    def _finish(self, trained: Sequence[Trained[Item]], *, stepped: bool) -> Metrics:
        """Sum ``trained`` over the ranks, then the optimiser step (``stepped``: some item had signal)."""
        total_loss, n_tok = 0.0, 0
        sums = {"clip_frac": 0.0, "approx_kl": 0.0}
        for t in trained:
            total_loss += t.loss
            n_tok += t.tokens
            for name in sums:
                sums[name] += t.metrics[name] * t.tokens
        total_loss, n_tok, *summed = parallel.all_sum([total_loss, n_tok, *sums.values()], self.model)
        metrics = {f"{self.name}/loss": total_loss}
        metrics |= {f"{self.name}/{name}": s / max(n_tok, 1) for name, s in zip(sums, summed, strict=True)}
        return metrics | self._optimizer_step(stepped)

    def _optimizer_step(self, stepped: bool) -> Metrics:
        """Clip the gradient norm, then step, unless the norm is not finite. The norm is the global one,
        so every rank judges it alike and all skip together."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        grad_norm = float(parallel.full_tensor(norm))
        finite = math.isfinite(grad_norm)
        if not finite:
            log.warning(
                "%s update: the gradient norm is %s, so this optimiser step was skipped (weights and "
                "optimiser state unchanged). If it happens again, lower the learning rate or look for NaN or "
                "inf rewards and log-probs in the batch.",
                self.name,
                grad_norm,
            )
        if stepped and finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {f"{self.name}/grad_norm": grad_norm, f"{self.name}/nonfinite_grad_steps": float(not finite)}

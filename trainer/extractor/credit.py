"""Credit assignment for the extractor (docs/design.md §3.2): outcomes → generation rewards → a training
batch.

Every πϕ generation (distil, merge, refine) is identified by its prompt, response and weight version. Each
trajectory guided by an entry adds r = +1 (success) or −1 (failure) to the generation behind that entry;
a Search-and-Ask refinement is credited by the outcome of the episode that asked. A generation's reward
r̄ is the mean over every trajectory it ever guided.

Credited generations wait in the buffer, each at most once (unique generations), until it holds
``size`` of them; ``take`` then returns the batch with Â_i = r̄_i − mean_B r̄ multiplied by the
training-count weight w_i (0 within ``delta`` extractor steps of its last use, else (1 + c_i)^−α), and
updates the counters, which this buffer keeps itself for every generation it has seen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from trainer import losses
from trainer.store import Generation


def generation_key(g: Generation) -> str:
    """A stable id of a generation: the same sample always has the same key."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(f"{g.weight_version}\x00{g.prompt}\x00{g.response}\x00".encode())
    h.update(",".join(map(str, g.token_ids)).encode())
    return h.hexdigest()


def trainable(g: Generation | None) -> bool:
    """A generation the update can train on (person-written or imported entries have none)."""
    return g is not None and bool(g.token_ids) and len(g.logprobs) == len(g.token_ids) and bool(g.prompt)


@dataclass
class Record:
    """Everything known about one generation."""

    key: str
    generation: Generation
    kind: str
    """distil, merge or refine."""
    entry_ids: set[int] = field(default_factory=set)
    """Bank entries it produced that were credited (their training counters are bumped with it)."""
    reward_sum: float = 0.0
    outcomes: int = 0
    train_count: int = 0
    last_trained_step: int | None = None

    @property
    def reward(self) -> float:
        """r̄: mean experience reward over the trajectories it guided."""
        return self.reward_sum / self.outcomes if self.outcomes else 0.0


@dataclass
class Batch:
    """One CISPO batch: the records, their mean rewards, advantages and training-count weights."""

    records: list[Record]
    rewards: torch.Tensor
    """(N,) r̄_i."""
    advantages: torch.Tensor
    """(N,) w_i · (r̄_i − mean r̄)."""
    weights: torch.Tensor
    """(N,) w_i (all 1 without reweighting)."""
    step: int
    """The extractor step t this batch trains."""

    @property
    def entry_ids(self) -> list[int]:
        return sorted({i for r in self.records for i in r.entry_ids})


class CreditBuffer:
    """Generation rewards and the training buffer of unique generations (see the module docstring)."""

    def __init__(self, size: int, *, delta: int = 1, alpha: float = 0.5, reweight: bool = True) -> None:
        if size < 1:
            raise ValueError(f"the buffer size must be at least 1 (got {size})")
        self.size = size
        self.delta = delta
        self.alpha = alpha
        self.reweight = reweight
        self.records: dict[str, Record] = {}
        self.pending: dict[str, None] = {}
        """Keys of credited generations waiting for the next step, in order of arrival (a set with order)."""
        self.steps_taken = 0
        self.uncreditable = 0
        """Outcomes of entries without a trainable generation (imported or written by a person)."""

    def credit(
        self, generation: Generation | None, success: bool, *, kind: str, entry_id: int | None = None
    ) -> str | None:
        """Add r(m, τ) = ±1 to ``generation``'s reward and queue it for training; returns its key."""
        if not trainable(generation):
            self.uncreditable += 1
            return None
        assert generation is not None
        key = generation_key(generation)
        record = self.records.get(key)
        if record is None:
            record = self.records[key] = Record(key, generation, kind)
        if entry_id is not None:
            record.entry_ids.add(entry_id)
        record.reward_sum += losses.experience_reward(success)
        record.outcomes += 1
        self.pending[key] = None
        return key

    def credit_many(self, items: Iterable[tuple[Generation | None, bool, str, int | None]]) -> None:
        """``credit`` for (generation, success, kind, entry id) tuples."""
        for generation, success, kind, entry_id in items:
            self.credit(generation, success, kind=kind, entry_id=entry_id)

    def state_dict(self) -> dict:
        """Everything needed to go on after a resume: rewards so far, the waiting keys, the counters."""
        return {
            "records": dict(self.records),
            "pending": list(self.pending),
            "steps_taken": self.steps_taken,
            "uncreditable": self.uncreditable,
        }

    def load_state_dict(self, state: dict) -> None:
        self.records = dict(state["records"])
        self.pending = dict.fromkeys(state["pending"])
        self.steps_taken = state["steps_taken"]
        self.uncreditable = state["uncreditable"]

    def ready(self) -> bool:
        return len(self.pending) >= self.size

    def weight(self, record: Record, step: int) -> float:
        if not self.reweight:
            return 1.0
        return losses.training_count_weight(
            step, record.last_trained_step, record.train_count, delta=self.delta, alpha=self.alpha
        )

    def take(self) -> Batch:
        """The first ``size`` waiting generations as a batch for extractor step t = steps taken + 1;
        their counters are updated (they are now trained once more, at step t)."""
        if not self.ready():
            raise ValueError(f"the buffer holds {len(self.pending)} generations, fewer than {self.size}")
        step = self.steps_taken + 1
        keys = list(self.pending)[: self.size]
        for key in keys:
            del self.pending[key]
        records = [self.records[k] for k in keys]
        rewards = torch.tensor([r.reward for r in records], dtype=torch.float32)
        weights = torch.tensor([self.weight(r, step) for r in records], dtype=torch.float32)
        advantages = losses.extractor_advantages(rewards) * weights
        for r, w in zip(records, weights.tolist(), strict=True):
            if w > 0:
                r.train_count += 1
                r.last_trained_step = step
        self.steps_taken = step
        return Batch(records, rewards, advantages, weights, step)

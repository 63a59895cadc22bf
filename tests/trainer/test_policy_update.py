"""A step whose gradient norm is not finite (issue 48): the actor's and πϕ's updates (``trainer.update``)
skip it, leaving the weights and the AdamW state as they were, warn and count it; a finite step still
trains, before it and after it.

The actor's batch gets a NaN reward (its subgroup's advantages become NaN), πϕ's an infinite advantage:
both reach the gradient through the real forward and backward. A tiny random Llama, float32, on the CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable

import pytest
import torch

from tests.trainer.dist_worker import _Prompts, actor_batch, extractor_batch, tiny_llama
from trainer.actor import ActorUpdate
from trainer.config import ActorConfig, ExtractorConfig
from trainer.extractor.update import ExtractorUpdate
from trainer.metrics import Metrics
from trainer.update import PolicyUpdate

Step = Callable[[bool], Metrics]
"""One update step; True: on the batch poisoned with a non-finite value."""


def _actor() -> tuple[PolicyUpdate, Step]:
    model = tiny_llama(0)
    episodes = actor_batch(model)
    poisoned = [dataclasses.replace(episodes[0], reward=math.nan), *episodes[1:]]
    update = ActorUpdate(
        model, ActorConfig(lr=1e-3, micro_batch_size=2, gradient_checkpointing=False), estimator="grpo_split"
    )
    return update, lambda poison: update.step(poisoned if poison else episodes)


def _extractor() -> tuple[PolicyUpdate, Step]:
    model = tiny_llama(1)
    batch = extractor_batch(model)
    advantages = batch.advantages.clone()
    advantages[0] = math.inf
    poisoned = dataclasses.replace(batch, advantages=advantages)
    cfg = ExtractorConfig(lr=1e-3, micro_batch_size=2, gradient_checkpointing=False)
    update = ExtractorUpdate(model, cfg)
    return update, lambda poison: update.step(poisoned if poison else batch, _Prompts())  # type: ignore[arg-type]


TRAINERS = {"actor": _actor, "extractor": _extractor}


def _state(update: PolicyUpdate) -> tuple[dict, dict]:
    return copy.deepcopy(update.model.state_dict()), copy.deepcopy(update.optimizer.state_dict())


def _assert_same(a: object, b: object, where: str = "") -> None:
    """Equal to the bit: tensors by value (NaN nowhere expected), containers item by item."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, where


def _moved(before: dict, after: dict) -> float:
    return max(float((after[n] - before[n]).abs().max()) for n in before)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_finite_step_counts_no_skip_and_changes_the_weights(trainer):
    update, step = TRAINERS[trainer]()
    before, _ = _state(update)
    metrics = step(False)
    assert metrics[f"{trainer}/nonfinite_grad_steps"] == 0.0
    assert math.isfinite(metrics[f"{trainer}/grad_norm"]) and metrics[f"{trainer}/grad_norm"] > 0
    assert _moved(before, update.model.state_dict()) > 1e-5


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_step_whose_gradient_norm_is_not_finite_changes_nothing_and_is_counted(trainer, caplog):
    update, step = TRAINERS[trainer]()
    step(False)  # AdamW now holds a step count and moments to keep
    weights, optimizer = _state(update)
    assert optimizer["state"], "the finite step should have filled the optimiser state"

    with caplog.at_level("WARNING", logger="trainer.update"):
        metrics = step(True)
    assert metrics[f"{trainer}/nonfinite_grad_steps"] == 1.0
    assert not math.isfinite(metrics[f"{trainer}/grad_norm"])
    _assert_same(update.model.state_dict(), weights, "weights")
    _assert_same(update.optimizer.state_dict(), optimizer, "optimizer")
    assert all(p.grad is None for p in update.model.parameters())
    assert "skipped" in caplog.text and "lower the learning rate" in caplog.text

    after = step(False)  # the run goes on: the next finite step trains again
    assert after[f"{trainer}/nonfinite_grad_steps"] == 0.0
    assert _moved(weights, update.model.state_dict()) > 1e-5

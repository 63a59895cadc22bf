"""Data parallelism (issue 36): a 2-process FSDP2 run over gloo equals the 1-process run.

``dist_worker.py`` runs the same actor split-GRPO step and extractor CISPO step on one tiny random
Llama, once as a plain process and once under ``torchrun --nproc-per-node 2``; each writes what it saw.
Then new processes resume the actor from the 2-process run's DCP checkpoint and take its second step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trainer import parallel

WORKER = Path(__file__).with_name("dist_worker.py")
REPO = Path(__file__).resolve().parents[2]
ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _run(out: Path, mode: str, nproc: int, *more: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    done = subprocess.run(
        [*launcher, str(WORKER), mode, str(out), *more], env=ENV, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return torch.load(out / f"{mode}-{nproc}.pt", weights_only=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    return {"one": _run(one, "steps", 1), "two": _run(two, "steps", 2), "resumed": _run(two, "resume", 2)}


def _relative_errors(a: dict, b: dict) -> dict[str, float]:
    assert a.keys() == b.keys()
    return {n: float((a[n] - b[n]).norm() / b[n].norm().clamp(min=1e-12)) for n in a}


def _max_abs(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@pytest.mark.parametrize("part", ["actor", "extractor"])
def test_two_ranks_give_the_one_process_loss_gradients_and_weights(runs, part):
    one, two = runs["one"], runs["two"]
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert abs(two[f"{part}_loss"] - one[f"{part}_loss"]) < 1e-5
    assert max(float(g.norm()) for g in one[f"{part}_grads"].values()) > 0.0  # a step that learns
    errors = _relative_errors(two[f"{part}_grads"], one[f"{part}_grads"])
    assert max(errors.values()) < 1e-5, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    assert _max_abs(two[f"{part}_weights"], one[f"{part}_weights"]) < 1e-6
    moved = _max_abs(one[f"{part}_weights"], one[f"{part}_initial"])
    assert moved > 1e-7  # the optimiser step changed the weights


def test_a_two_rank_run_resumed_from_its_dcp_checkpoint_equals_the_one_that_never_stopped(runs):
    never_stopped, resumed = runs["two"]["actor_weights_2"], runs["resumed"]["actor_weights_2"]
    assert _max_abs(resumed, never_stopped) == 0.0
    assert _max_abs(never_stopped, runs["two"]["actor_weights"]) > 0.0  # the second step did move


@pytest.mark.parametrize(("n", "world", "size"), [(11, 3, 2), (1, 2, 1), (8, 2, 4), (5, 4, 1)])
def test_rank_micro_batches_cover_every_item_once_in_equal_numbers_of_micro_batches(n, world, size):
    items = list(range(n))
    shares = [parallel.rank_micro_batches(items, size, rank, world) for rank in range(world)]
    assert sorted(i for share in shares for mb in share for i in mb) == items
    assert len({len(share) for share in shares}) == 1  # every rank joins every collective
    assert all(len(mb) <= size for share in shares for mb in share)


def _within_one_of_the_balanced_share(counts: list[int], total: int) -> bool:
    return sum(counts) == total and all(abs(c - total / len(counts)) < 1 for c in counts)


@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 16), st.data())
def test_every_rank_plays_within_one_of_its_share_of_guided_and_of_free_episodes(world, tasks, k, data):
    """Issue 47: a step's tasks x K rollouts, the first ``split`` of each task guided (``sample_tasks``)."""
    split = data.draw(st.integers(0, k))
    guided = [j < split for _ in range(tasks) for j in range(k)]
    owners = parallel.owners(guided, world)
    assert len(owners) == len(guided) and all(0 <= r < world for r in owners)
    assert owners == parallel.owners(guided, world)  # from the specs alone: every rank gets the same answer
    played = [[g for g, r in zip(guided, owners, strict=True) if r == rank] for rank in range(world)]
    assert _within_one_of_the_balanced_share([sum(p) for p in played], sum(guided))
    assert _within_one_of_the_balanced_share([len(p) - sum(p) for p in played], len(guided) - sum(guided))
    assert _within_one_of_the_balanced_share([len(p) for p in played], len(guided))
    if world > 1 and sum(guided) > 1:
        assert any(g for p in played[1:] for g in p)  # not only rank 0 plays guided episodes


@given(st.lists(st.booleans(), max_size=40), st.integers(1, 8))
def test_any_order_of_guided_and_free_episodes_balances_both(guided, world):
    owners = parallel.owners(guided, world)
    played = [[g for g, r in zip(guided, owners, strict=True) if r == rank] for rank in range(world)]
    assert _within_one_of_the_balanced_share([sum(p) for p in played], sum(guided))
    assert _within_one_of_the_balanced_share([len(p) - sum(p) for p in played], len(guided) - sum(guided))
    if not any(guided):  # every world_size-th from rank 0
        assert owners == [i % world for i in range(len(guided))]

"""Credit assignment and the training buffer on hand-built outcomes: exact rewards, advantages, weights."""

from __future__ import annotations

import pytest
import torch

from trainer.extractor.credit import CreditBuffer, generation_key
from trainer.store import Generation


def gen(name: str, version: int = 0) -> Generation:
    return Generation(f"prompt {name}", f"response {name}", (1, 2, 3), (-0.1, -0.2, -0.3), version)


A, B, C = gen("A"), gen("B"), gen("C")


def test_two_entries_and_a_refinement_with_mixed_outcomes_get_exact_rewards_and_advantages():
    buffer = CreditBuffer(3)
    # entry 1 (generation A) guided three trajectories: two successes, one failure -> 1/3
    for success in (True, True, False):
        buffer.credit(A, success, kind="distil", entry_id=1)
    # entry 2 (generation B) guided two failures -> -1
    buffer.credit(B, False, kind="distil", entry_id=2)
    buffer.credit(B, False, kind="distil", entry_id=2)
    assert not buffer.ready()  # unique generations: B counts once
    # a Search-and-Ask refinement (generation C) of a successful episode -> +1
    buffer.credit(C, True, kind="refine")
    assert buffer.ready()
    batch = buffer.take()
    assert [r.key for r in batch.records] == [generation_key(A), generation_key(B), generation_key(C)]
    torch.testing.assert_close(batch.rewards, torch.tensor([1 / 3, -1.0, 1.0]))
    mean = (1 / 3 - 1 + 1) / 3
    torch.testing.assert_close(batch.advantages, torch.tensor([1 / 3 - mean, -1 - mean, 1 - mean]))
    assert batch.advantages.sum().abs() < 1e-6  # centred, no std division
    assert batch.entry_ids == [1, 2] and batch.step == 1
    assert not buffer.pending


def test_the_same_text_from_other_weights_is_another_generation():
    assert generation_key(gen("A", 0)) != generation_key(gen("A", 1))
    assert generation_key(gen("A")) == generation_key(Generation(*vars(gen("A")).values()))


def test_entries_without_a_trainable_generation_are_counted_not_credited():
    buffer = CreditBuffer(1)
    assert buffer.credit(Generation(), True, kind="distil", entry_id=5) is None
    assert buffer.credit(None, False, kind="distil", entry_id=6) is None
    assert buffer.uncreditable == 2 and not buffer.ready()


def test_reweighting_over_a_sequence_of_training_steps():
    buffer = CreditBuffer(2, delta=1, alpha=0.5)
    buffer.credit(A, True, kind="distil")
    buffer.credit(B, False, kind="distil")
    step1 = buffer.take()
    assert step1.weights.tolist() == [1.0, 1.0]  # never trained: w = 1
    # A guides again, with C new: A was trained once, one step ago (t - t_last = 1 >= delta)
    buffer.credit(A, False, kind="distil")
    buffer.credit(C, True, kind="distil")
    step2 = buffer.take()
    torch.testing.assert_close(step2.weights, torch.tensor([2**-0.5, 1.0]))
    # A's reward is the mean of all its outcomes so far: (+1 - 1) / 2 = 0
    torch.testing.assert_close(step2.rewards, torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(step2.advantages, torch.tensor([-0.5 * 2**-0.5, 0.5]))
    # twice trained: (1 + 2)^-0.5
    buffer.credit(A, True, kind="distil")
    buffer.credit(B, True, kind="distil")
    step3 = buffer.take()
    torch.testing.assert_close(step3.weights, torch.tensor([3**-0.5, 2**-0.5]))
    record = buffer.records[generation_key(A)]
    assert (record.train_count, record.last_trained_step) == (3, 3)


def test_reweighting_blocks_a_generation_within_delta_and_can_be_switched_off():
    buffer = CreditBuffer(1, delta=2, alpha=0.5)
    buffer.credit(A, True, kind="distil")
    assert buffer.take().weights.tolist() == [1.0]
    buffer.credit(A, True, kind="distil")
    blocked = buffer.take()  # step 2: 2 - 1 < delta
    assert blocked.weights.tolist() == [0.0] and blocked.advantages.tolist() == [0.0]
    assert buffer.records[generation_key(A)].train_count == 1  # a zero-weight sample was not trained
    buffer.credit(A, True, kind="distil")
    assert buffer.take().weights.tolist() == [pytest.approx(2**-0.5)]  # step 3: 3 - 1 >= delta
    plain = CreditBuffer(1, reweight=False)
    for _ in range(3):
        plain.credit(A, True, kind="distil")
        assert plain.take().weights.tolist() == [1.0]


def test_take_refuses_a_buffer_that_is_not_full():
    with pytest.raises(ValueError, match="fewer than 2"):
        CreditBuffer(2).take()


def test_a_saved_buffer_resumes_with_the_same_rewards_counters_and_next_batch(tmp_path):
    def filled() -> CreditBuffer:
        buffer = CreditBuffer(2)
        for g, success in ((A, True), (B, False)):
            buffer.credit(g, success, kind="distil", entry_id=1)
        buffer.take()  # step 1: A and B trained once
        buffer.credit(A, False, kind="distil", entry_id=1)
        buffer.credit(C, True, kind="refine")
        return buffer

    torch.save(filled().state_dict(), tmp_path / "state.pt")
    resumed = CreditBuffer(2)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    want, got = filled().take(), resumed.take()
    assert [r.key for r in got.records] == [r.key for r in want.records]
    for name in ("rewards", "advantages", "weights"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name))
    assert got.step == want.step == 2 and resumed.records[generation_key(A)].train_count == 2

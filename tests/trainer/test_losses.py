"""Losses and advantages against slow python-loop references on hand-made tensors."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from trainer.losses import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    cispo,
    experience_reward,
    extractor_advantages,
    generation_rewards,
    get_adv_estimator,
    get_policy_loss,
    ppo_clip,
    subgroup_weights,
    training_count_weight,
)

EPS = 1e-6


# ---- slow references -----------------------------------------------------------------------------


def ref_group_normalise(rewards: list[float], keys: list) -> list[float]:
    out = []
    for i, k in enumerate(keys):
        group = [r for r, kk in zip(rewards, keys, strict=True) if kk == k]
        if len(group) < 2 or max(group) == min(group):
            out.append(0.0)
        else:
            out.append((rewards[i] - statistics.mean(group)) / (statistics.stdev(group) + EPS))
    return out


def ref_seq_losses(loss_tok: torch.Tensor, mask: torch.Tensor, per_token_mean: bool) -> list[torch.Tensor]:
    B, T = loss_tok.shape
    seqs = []
    for i in range(B):
        terms = [loss_tok[i, t] for t in range(T) if mask[i, t]]
        if not terms:
            seqs.append(None)
            continue
        total = sum(terms)
        seqs.append(total / len(terms) if per_token_mean else total)
    return seqs


def ref_aggregate(loss_tok, mask, mode, seq_weights=None):
    B, T = loss_tok.shape
    if mode == "token-mean":
        terms = [loss_tok[i, t] for i in range(B) for t in range(T) if mask[i, t]]
        return sum(terms) / len(terms)
    seqs = ref_seq_losses(loss_tok, mask, per_token_mean=mode == "seq-mean-token-mean")
    if seq_weights is None:
        present = [s for s in seqs if s is not None]
        return sum(present) / len(present)
    return sum(w * s for w, s in zip(seq_weights.tolist(), seqs, strict=True) if s is not None)


def ref_ppo_tok(logp, old_logp, adv, eps=0.2):
    """Per-token PPO-clip loss built from scalar ops, so autograd gives the reference gradient."""
    B, T = logp.shape
    rows = []
    for i in range(B):
        row = []
        for t in range(T):
            ratio = torch.exp(logp[i, t] - old_logp[i, t])
            a = float(adv[i])
            clipped = min(max(ratio.item(), 1 - eps), 1 + eps)
            unclipped_term = -a * ratio
            clipped_term = -a * clipped  # a constant: no gradient through the clipped branch
            row.append(
                unclipped_term if unclipped_term.item() >= clipped_term else unclipped_term * 0 + clipped_term
            )
        rows.append(torch.stack(row))
    return torch.stack(rows)


def ref_cispo_tok(logp, old_logp, adv, eps=0.1):
    B, T = logp.shape
    rows = []
    for i in range(B):
        row = []
        for t in range(T):
            w = min(max(math.exp((logp[i, t] - old_logp[i, t]).item()), 1 - eps), 1 + eps)
            row.append(-w * float(adv[i]) * logp[i, t])
        rows.append(torch.stack(row))
    return torch.stack(rows)


def make_batch(B=4, T=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    old_logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    # ratios spread across [e^-0.5, e^0.5] so that both clip sides are hit
    logp = (old_logp + (torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.5)).requires_grad_()
    adv = torch.tensor([1.5, -0.7, 0.3, -2.0], dtype=torch.float64)[:B]
    mask = torch.rand(B, T, generator=gen) > 0.3
    mask[:, 0] = True
    return logp, old_logp, adv, mask


# ---- advantages ----------------------------------------------------------------------------------


def test_grpo_split_matches_reference_per_task_and_subgroup():
    rewards = [1, 0, 1, 1, 0.5, 0, 0, 1, 1, 1, 1, 1, 0.2, 0.9, 0.4, 0.0, 1.0]
    groups = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    guided = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1]
    adv, metrics = get_adv_estimator("grpo_split")(
        torch.tensor(rewards), torch.tensor(groups), torch.tensor(guided, dtype=torch.bool)
    )
    expected = ref_group_normalise(rewards, list(zip(groups, guided, strict=True)))
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)
    assert adv.dtype == torch.float32
    # subgroups (0,g) (0,f) (1,g) (1,f) (2,g) (2,f) (3,g); flat: (1,g) (1,f) (3,g)
    assert metrics["adv/zero_groups_frac"] == pytest.approx(3 / 7)
    assert metrics["adv/guided_mean"] == pytest.approx(
        statistics.mean(e for e, g in zip(expected, guided, strict=True) if g), abs=1e-6
    )


@pytest.mark.parametrize("name", ["grpo", "grpo_cross"])
def test_grpo_and_cross_normalise_over_the_whole_task_instance(name):
    rewards = [1, 0, 1, 1, 0.5, 0, 0, 1, 0.3, 0.3]
    groups = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    guided = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0]
    adv, _ = get_adv_estimator(name)(
        torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), torch.tensor(guided).bool()
    )
    assert adv.tolist() == pytest.approx(ref_group_normalise(rewards, groups), abs=1e-9)


def test_split_and_cross_differ_when_subgroups_differ():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    groups = torch.zeros(4, dtype=torch.long)
    guided = torch.tensor([True, True, False, False])
    split, _ = get_adv_estimator("grpo_split")(rewards, groups, guided)
    cross, _ = get_adv_estimator("grpo_cross")(rewards, groups, guided)
    assert split[:2].tolist() == [0.0, 0.0]  # guided half all succeeded: no signal within it
    assert cross[0] > 0 and cross[2] < 0


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATORS))
def test_equal_rewards_and_singletons_give_zero_not_nan(name):
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.7])  # 0.1 has no exact float mean
    groups = torch.tensor([5, 5, 5, 5, 9])
    guided = torch.tensor([True, False, True, False, True])
    adv, metrics = get_adv_estimator(name)(rewards, groups, guided)
    assert adv.tolist() == [0.0] * 5
    assert metrics["adv/zero_groups_frac"] == 1.0


def test_unknown_estimator_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'.*grpo_split"):
        get_adv_estimator("gae")


# ---- aggregation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_matches_reference(mode):
    gen = torch.Generator().manual_seed(1)
    loss_tok = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    mask = torch.rand(5, 7, generator=gen) > 0.4
    mask[3] = False  # a trajectory with no trainable tokens counts for nothing
    mask[0, 0] = True
    assert aggregate(loss_tok, mask, mode).item() == pytest.approx(ref_aggregate(loss_tok, mask, mode).item())


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_with_seq_weights_is_a_weighted_sum_of_sequence_losses(mode):
    gen = torch.Generator().manual_seed(2)
    loss_tok = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 3:] = False
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    got = aggregate(loss_tok, mask, mode, seq_weights=w).item()
    assert got == pytest.approx(ref_aggregate(loss_tok, mask, mode, seq_weights=w).item())


def test_aggregate_micro_batches_add_up_to_the_full_batch():
    gen = torch.Generator().manual_seed(3)
    loss_tok = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    mask = torch.rand(6, 4, generator=gen) > 0.3
    mask[:, 0] = True
    guided = torch.tensor([1, 1, 1, 0, 0, 0]).bool()
    w = subgroup_weights(guided)
    full = aggregate(loss_tok, mask, "seq-mean-token-mean", seq_weights=w)
    parts = sum(
        aggregate(loss_tok[s], mask[s], "seq-mean-token-mean", seq_weights=w[s])
        for s in (slice(0, 2), slice(2, 6))
    )
    assert parts.item() == pytest.approx(full.item())
    n = mask.sum().item()
    full_tok = aggregate(loss_tok, mask, "token-mean")
    parts_tok = sum(
        aggregate(loss_tok[s], mask[s], "token-mean", num_tokens=n) for s in (slice(0, 4), slice(4, 6))
    )
    assert parts_tok.item() == pytest.approx(full_tok.item())


def test_aggregate_rejects_unknown_modes_and_weights_for_token_mean():
    x, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="unknown aggregation mode 'seq-sum'"):
        aggregate(x, m, "seq-sum")
    with pytest.raises(ValueError, match="seq-mean modes"):
        aggregate(x, m, "token-mean", seq_weights=torch.ones(2))


def test_subgroup_weights_make_both_halves_weigh_equally():
    # task 0: 1 guided + 3 free; task 1: 2 + 2; task 2: only free (nothing retrieved)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    guided = torch.tensor([1, 0, 0, 0, 1, 1, 0, 0, 0, 0]).bool()
    w = subgroup_weights(guided, groups)
    expected = []
    for i in range(10):
        task = [j for j in range(10) if groups[j] == groups[i]]
        same = [j for j in task if guided[j] == guided[i]]
        n_sub = len({bool(guided[j]) for j in task})
        expected.append(1 / (3 * n_sub * len(same)))
    assert w.tolist() == pytest.approx(expected)
    assert w.sum().item() == pytest.approx(1.0)
    # the split objective ½ Σ_c mean_{i∈c} L_i for one task instance
    seq_losses = torch.tensor([4.0, 1.0, 2.0, 3.0])
    w0 = subgroup_weights(guided[:4])
    assert (w0 * seq_losses).sum().item() == pytest.approx(0.5 * 4.0 + 0.5 * 2.0)


def test_subgroup_weights_equal_plain_mean_when_halves_are_equal():
    guided = torch.tensor([1, 1, 0, 0, 1, 1, 0, 0]).bool()
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert subgroup_weights(guided, groups).tolist() == pytest.approx([1 / 8] * 8)
    assert subgroup_weights(torch.zeros(5, dtype=torch.bool)).tolist() == pytest.approx([1 / 5] * 5)


# ---- policy losses -------------------------------------------------------------------------------


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_ppo_clip_value_and_gradient_match_reference(agg):
    logp, old_logp, adv, mask = make_batch()
    loss, _ = ppo_clip(logp, old_logp, adv, mask, agg=agg)
    (grad,) = torch.autograd.grad(loss, logp)
    ref_logp = logp.detach().clone().requires_grad_()
    ref = ref_aggregate(ref_ppo_tok(ref_logp, old_logp, adv), mask, agg)
    (ref_grad,) = torch.autograd.grad(ref, ref_logp)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    torch.testing.assert_close(grad, ref_grad)


def test_ppo_clip_fraction_and_kl_metrics():
    old_logp = torch.zeros(1, 4, dtype=torch.float64)
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7]], dtype=torch.float64)
    logp = ratios.log()
    mask = torch.ones(1, 4, dtype=torch.bool)
    # A > 0: the clip is active only above 1 + eps; A < 0: only below 1 - eps
    _, pos = ppo_clip(logp, old_logp, torch.tensor([1.0]), mask)
    _, neg = ppo_clip(logp, old_logp, torch.tensor([-1.0]), mask)
    assert pos["clip_frac"] == pytest.approx(1 / 4)
    assert neg["clip_frac"] == pytest.approx(2 / 4)
    kl = statistics.mean(r - 1 - math.log(r) for r in ratios[0].tolist())
    assert pos["approx_kl"] == pytest.approx(kl)
    assert pos["ratio_max"] == pytest.approx(1.5)
    _, same = ppo_clip(old_logp, old_logp, torch.tensor([1.0]), mask)
    assert same["approx_kl"] == 0.0 and same["clip_frac"] == 0.0


def test_cispo_value_matches_reference_and_weight_is_detached():
    logp, old_logp, adv, mask = make_batch(seed=4)
    loss, metrics = cispo(logp, old_logp, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    ref = ref_aggregate(ref_cispo_tok(logp, old_logp, adv), mask, "token-mean")
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    # d/dlogp of -sg(w)·A·logp / N is exactly -w·A / N, also where the ratio is clipped
    n = mask.sum().item()
    ratio = torch.exp(logp.detach() - old_logp)
    w = ratio.clamp(0.9, 1.1)
    expected = torch.where(mask, -w * adv[:, None] / n, torch.zeros_like(w))
    torch.testing.assert_close(grad, expected)
    outside = (ratio < 0.9) | (ratio > 1.1)
    assert (outside & mask).any() and (grad[outside & mask] != 0).all()
    assert metrics["clip_frac"] == pytest.approx((outside & mask).sum().item() / n)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_masked_tokens_contribute_nothing(name):
    loss_fn = get_policy_loss(name)
    logp, old_logp, adv, mask = make_batch(seed=5)
    loss, metrics = loss_fn(logp, old_logp, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    garbage_logp = torch.where(mask, logp.detach(), torch.full_like(logp, -math.inf)).requires_grad_()
    garbage_old = torch.where(mask, old_logp, torch.full_like(old_logp, 50.0))
    loss2, metrics2 = loss_fn(garbage_logp, garbage_old, adv, mask)
    (grad2,) = torch.autograd.grad(loss2, garbage_logp)
    assert loss2.item() == loss.item()
    assert metrics2 == metrics
    assert (grad2[~mask] == 0).all() and (grad[~mask] == 0).all()
    torch.testing.assert_close(grad2, grad)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_zero_advantage_gives_zero_loss_and_zero_gradient(name):
    logp, old_logp, _, mask = make_batch(seed=6)
    loss, _ = get_policy_loss(name)(logp, old_logp, torch.zeros(4, dtype=torch.float64), mask)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == 0.0
    assert (grad == 0).all()


def test_policy_losses_check_shapes_and_names():
    logp, old_logp, adv, mask = make_batch()
    with pytest.raises(ValueError, match=r"adv must be \(B,\)"):
        ppo_clip(logp, old_logp, adv[:, None].expand(4, 6), mask)
    with pytest.raises(ValueError, match=r"must all be \(B, T\)"):
        cispo(logp, old_logp[:, :3], adv, mask)
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'.*cispo.*ppo_clip"):
        get_policy_loss("ppo")


# ---- extractor credit assignment and reweighting -------------------------------------------------


def test_generation_rewards_average_guided_outcomes_per_generation():
    outcomes = [("g2", experience_reward(True)), ("g1", -1.0), ("g2", -1.0), ("g2", 1.0), ("g1", -1.0)]
    got = generation_rewards(outcomes)
    assert got == {"g2": pytest.approx(1 / 3), "g1": -1.0}
    assert list(got) == ["g2", "g1"]
    assert generation_rewards([]) == {}


def test_extractor_advantages_centre_without_std():
    r = torch.tensor([1.0, -1.0, 0.5, 1.0 / 3])
    adv = extractor_advantages(r)
    assert adv.tolist() == pytest.approx([x - sum(r.tolist()) / 4 for x in r.tolist()])


def test_training_count_weight_over_a_sequence_of_steps():
    """Simulate one generation sitting in the buffer: it is trained at steps 3 and 4 (delta 1), and at 6."""
    last, count = None, 0
    weights = []
    for step in range(8):
        w = training_count_weight(step, last, count, delta=1, alpha=0.5)
        weights.append(w)
        if step in (3, 4, 6) and w > 0:
            last, count = step, count + 1
    assert weights[:4] == [1.0, 1.0, 1.0, 1.0]
    assert weights[4] == pytest.approx(2**-0.5)  # trained once, one step ago
    assert weights[5] == pytest.approx(3**-0.5)
    assert weights[6] == pytest.approx(3**-0.5)
    assert weights[7] == pytest.approx(4**-0.5)


def test_training_count_weight_blocks_within_delta():
    assert training_count_weight(10, 9, 2, delta=2) == 0.0
    assert training_count_weight(10, 10, 2, delta=1) == 0.0
    assert training_count_weight(11, 9, 3, delta=2, alpha=1.0) == pytest.approx(0.25)
    assert training_count_weight(5, None, 0, delta=3) == 1.0

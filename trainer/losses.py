"""Pure loss and advantage functions for Complementary RL (docs/design.md §3.1, §3.2).

In the style of verl's ``core_algos.py``: every advantage estimator and every policy loss is a module-level
function with one signature, registered by name; the training loop dispatches once through
``get_adv_estimator(name)`` and ``get_policy_loss(name)``. Plain tensors and floats in, ``(value, metrics)``
out, where metrics are plain floats ready for a progress reporter.

Shapes: ``logp``, ``old_logp``, ``mask``: (B, T) over the generated tokens of B trajectories (1 where the
token was produced by the model being trained; environment observations, injected experience and tool results
are 0). ``adv``: (B,), one advantage per trajectory, broadcast over its tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Protocol, TypeVar

import torch

from trainer.metrics import Metrics

K = TypeVar("K", bound=Hashable)

# exp() of a log-ratio beyond this is numerically meaningless; clamping keeps masked garbage finite too
_MAX_LOG_RATIO = 20.0


# ---- advantage estimators ----------------------------------------------------------------------------


class AdvantageEstimator(Protocol):
    def __call__(
        self, rewards: torch.Tensor, group_ids: torch.Tensor, guided: torch.Tensor, *, eps: float = ...
    ) -> tuple[torch.Tensor, Metrics]: ...


ADV_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_adv_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Register an advantage estimator under ``name`` (decorator)."""

    def deco(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADV_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ADV_ESTIMATORS[name] = fn
        return fn

    return deco


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The advantage estimator registered as ``name``."""
    try:
        return ADV_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADV_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}") from None


def group_normalise(rewards: torch.Tensor, keys: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO normalisation within groups: (r - mean_g) / (std_g + eps) for each group g of equal ``keys``.

    ``std`` is the unbiased sample std (as torch, verl and ROLL compute it). A group whose rewards are all
    equal, including a group of one, gets advantage exactly 0 (never NaN, never r / eps).
    rewards, keys: (B,). Returns (B,) in the dtype of ``rewards``.
    """
    (B,) = rewards.shape
    if keys.shape != (B,):
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group keys {tuple(keys.shape)} must both be (B,)"
        )
    r = rewards.detach().to(torch.float64)
    _, idx = torch.unique(keys, return_inverse=True)  # (B,) group index of each trajectory
    G = int(idx.max()) + 1 if B else 0
    count = torch.bincount(idx, minlength=G).to(torch.float64)  # (G,)
    mean = r.new_zeros(G).index_add_(0, idx, r) / count
    dev = r - mean[idx]
    var = r.new_zeros(G).index_add_(0, idx, dev * dev) / (count - 1).clamp(min=1)
    # all-equal groups: test max == min exactly, since float means of equal values need not be exact
    r_max = r.new_full((G,), -torch.inf).scatter_reduce(0, idx, r, "amax")
    r_min = r.new_full((G,), torch.inf).scatter_reduce(0, idx, r, "amin")
    flat = (r_max == r_min)[idx]
    adv = torch.where(flat, torch.zeros_like(dev), dev / (var.sqrt()[idx] + eps))
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def _adv_metrics(adv: torch.Tensor, guided: torch.Tensor, keys: torch.Tensor) -> Metrics:
    guided = guided.bool()
    _, idx = torch.unique(keys, return_inverse=True)
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    group_abs_max = adv.new_zeros(n_groups).scatter_reduce(0, idx, adv.abs(), "amax")
    n_flat = int((group_abs_max == 0).sum())
    metrics: Metrics = {
        "adv/mean": adv.mean().item() if adv.numel() else 0.0,
        "adv/abs_mean": adv.abs().mean().item() if adv.numel() else 0.0,
        # groups where every advantage is 0 give no learning signal (all succeeded or all failed)
        "adv/zero_groups_frac": n_flat / max(n_groups, 1),
    }
    for name, sel in (("guided", guided), ("free", ~guided)):
        if sel.any():
            metrics[f"adv/{name}_mean"] = adv[sel].mean().item()
    return metrics


@register_adv_estimator("grpo_split")
def grpo_split(
    rewards: torch.Tensor, group_ids: torch.Tensor, guided: torch.Tensor, *, eps: float = 1e-6
) -> tuple[torch.Tensor, Metrics]:
    """Split (grouped) GRPO advantages, the default (docs/design.md §3.1).

    Â_c = (r - mean_c) / (std_c + eps) within each subgroup c ∈ {guided, free} of each task instance.
    rewards: (B,) float; group_ids: (B,) int, the task instance; guided: (B,) bool. Returns adv (B,).
    """
    keys = group_ids.long() * 2 + guided.long()  # one key per (task instance, subgroup)
    adv = group_normalise(rewards, keys, eps)
    return adv, _adv_metrics(adv, guided, keys)


@register_adv_estimator("grpo")
@register_adv_estimator("grpo_cross")
def grpo(
    rewards: torch.Tensor, group_ids: torch.Tensor, guided: torch.Tensor, *, eps: float = 1e-6
) -> tuple[torch.Tensor, Metrics]:
    """Plain GRPO per task instance, ignoring the subgroup: (r - mean) / (std + eps) over all K rollouts.

    Registered twice because two settings share this math and differ only in which rollouts are sampled:
    ``grpo`` for the baseline and the no-split ablation (no guided/free halves to tell apart), and
    ``grpo_cross`` for the cross-group ablation (K/2 guided + K/2 free normalised together, which the
    paper reports collapses training).
    """
    keys = group_ids.long()
    adv = group_normalise(rewards, keys, eps)
    return adv, _adv_metrics(adv, guided, keys)


# ---- aggregation -----------------------------------------------------------------------------------

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def subgroup_weights(guided: torch.Tensor, group_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per-trajectory weights for the split objective ½ Σ_c mean_{i∈c} L_i (docs/design.md §3.1).

    Within each task instance (``group_ids``; None = the whole batch is one instance) each present subgroup
    c ∈ {guided, free} gets total weight 1/(number of present subgroups), shared equally by its K_c
    trajectories; then instances are averaged. With both halves present every weight is 1/(2·K_c·n_tasks),
    so both halves weigh equally whatever their sizes; with K_c = K/2 it equals a plain mean over
    trajectories. A batch with one subgroup only (baseline, no-split) gets the plain mean.
    guided: (B,) bool; group_ids: (B,) int. Returns (B,) float32 weights summing to 1.
    """
    (B,) = guided.shape
    if group_ids is None:
        group_ids = torch.zeros(B, dtype=torch.long, device=guided.device)
    _, task = torch.unique(group_ids, return_inverse=True)  # (B,) task index
    _, sub = torch.unique(task * 2 + guided.long(), return_inverse=True)  # (B,) subgroup index
    n_tasks = int(task.max()) + 1 if B else 0
    sub_size = torch.bincount(sub).float()  # (S,) trajectories per subgroup
    sub_task = task.new_zeros(len(sub_size)).scatter_(0, sub, task)
    subs_per_task = torch.bincount(sub_task, minlength=n_tasks).float()  # (n_tasks,) 1 or 2
    return 1.0 / (sub_size[sub] * subs_per_task[task] * max(n_tasks, 1))


def aggregate(
    loss_tok: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "seq-mean-token-mean",
    *,
    seq_weights: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> torch.Tensor:
    """Reduce per-token losses (B, T) to a scalar over the tokens where ``mask`` is set.

    - ``token-mean``: Σ_{i,t} m·l / Σ m, every token weighs the same (CISPO's 1/Σ|m_i|, docs/design.md §3.2);
    - ``seq-mean-token-mean``: mean over a trajectory's tokens, then a (weighted) mean over trajectories;
    - ``seq-mean-token-sum``: sum over a trajectory's tokens, then a (weighted) mean over trajectories.

    For the seq-mean modes ``seq_weights`` (B,) replaces the plain mean over trajectories with Σ_i w_i L_i,
    e.g. ``subgroup_weights`` for the split objective; trajectories without tokens count for nothing.
    For micro-batching, compute the weights over the whole batch (the per-micro-batch losses then add up
    to the full-batch loss), and for ``token-mean`` pass the whole batch's token count as ``num_tokens``.
    """
    if loss_tok.dim() != 2 or mask.shape != loss_tok.shape:
        raise ValueError(
            f"loss_tok and mask must both be (B, T); got {tuple(loss_tok.shape)}, {tuple(mask.shape)}"
        )
    m = mask.bool()
    # where() rather than multiply: a masked inf/NaN must not leak into the value or the gradient
    loss_tok = torch.where(m, loss_tok, torch.zeros_like(loss_tok))
    if mode == "token-mean":
        if seq_weights is not None:
            raise ValueError("seq_weights apply to the seq-mean modes, not to token-mean")
        denom = num_tokens if num_tokens is not None else m.sum().item()
        return loss_tok.sum() / max(denom, 1)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; known: {', '.join(AGG_MODES)}")
    n_tok = m.sum(dim=-1)  # (B,)
    seq_loss = loss_tok.sum(dim=-1)  # (B, T) -> (B,)
    if mode == "seq-mean-token-mean":
        seq_loss = seq_loss / n_tok.clamp(min=1)
    if seq_weights is None:
        has_tok = (n_tok > 0).to(loss_tok.dtype)
        seq_weights = has_tok / has_tok.sum().clamp(min=1)
    return (seq_loss * seq_weights.to(loss_tok.dtype)).sum()


# ---- policy losses ---------------------------------------------------------------------------------


class PolicyLoss(Protocol):
    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        *,
        eps_low: float = ...,
        eps_high: float = ...,
        agg: str = ...,
        seq_weights: torch.Tensor | None = ...,
        num_tokens: float | None = ...,
    ) -> tuple[torch.Tensor, Metrics]: ...


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register a policy loss under ``name`` (decorator)."""

    def deco(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``: the training loop's one dispatch."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        known = ", ".join(sorted(POLICY_LOSSES))
        raise ValueError(f"unknown policy loss {name!r}; known: {known}") from None


def _ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check shapes; return the bool mask, the token ratio π/π_old (B, T) and adv broadcast to (B, 1)."""
    B, T = logp.shape
    if old_logp.shape != (B, T) or mask.shape != (B, T):
        raise ValueError(
            f"logp, old_logp and mask must all be (B, T); got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    if adv.shape != (B,):
        raise ValueError(f"adv must be (B,) = ({B},), one advantage per trajectory; got {tuple(adv.shape)}")
    m = mask.bool()
    # masked positions get log-ratio 0: garbage there (padding, -inf) cannot reach value or gradient
    log_ratio = torch.where(m, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    return m, ratio, adv.detach().to(logp.dtype).unsqueeze(-1)  # adv: (B,) -> (B, 1)


def _masked_mean(x: torch.Tensor, m: torch.Tensor) -> float:
    return (torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1)).item()


def _ratio_metrics(ratio: torch.Tensor, m: torch.Tensor, clipped: torch.Tensor) -> Metrics:
    ratio = ratio.detach()
    return {
        "clip_frac": _masked_mean(clipped.to(ratio.dtype), m),
        # k3 estimator of KL(π_old || π): (ρ - 1) - log ρ, non-negative per token
        "approx_kl": _masked_mean(ratio - 1 - torch.log(ratio), m),
        "ratio_mean": _masked_mean(ratio, m),
        "ratio_max": ratio[m].max().item() if m.any() else 1.0,
    }


@register_policy_loss("ppo_clip")
def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "seq-mean-token-mean",
    seq_weights: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate, token-level ratio, no KL and no entropy term (the actor's loss,
    docs/design.md §3.1).

    l_t = max(-A·ρ_t, -A·clip(ρ_t, 1-ε_low, 1+ε_high)) with ρ_t = exp(logp_t - old_logp_t), ε = 0.2,
    then ``aggregate``d (with ``subgroup_weights`` this is the split objective ½ Σ_c mean_{i∈c}).
    Metric ``clip_frac``: fraction of masked-in tokens where the clipped term is the active one (no gradient).
    logp, old_logp, mask: (B, T); adv: (B,).
    """
    m, ratio, a = _ratio(logp, old_logp, adv, mask)
    pg_unclipped = -a * ratio
    pg_clipped = -a * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss_tok = torch.maximum(pg_unclipped, pg_clipped)
    loss = aggregate(loss_tok, m, agg, seq_weights=seq_weights, num_tokens=num_tokens)
    return loss, _ratio_metrics(ratio, m, pg_clipped > pg_unclipped)


@register_policy_loss("cispo")
def cispo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.1,
    eps_high: float = 0.1,
    agg: str = "token-mean",
    seq_weights: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1), the extractor's loss (docs/design.md §3.2):

    L = -(1/Σ_i|m_i|) Σ_i Σ_t sg(clip(ρ_{i,t}, 1-ε_low, 1+ε_high)) · Â_i · log π(m_{i,t} | ...),

    ε_low = ε_high = 0.1. The clipped importance weight is detached, so unlike PPO every token keeps a
    gradient -sg(w)·Â through log π. ``token-mean`` is the paper's 1/Σ|m_i|; when the buffer is split into
    micro-batches pass the buffer's total token count as ``num_tokens``.
    Metric ``clip_frac``: fraction of masked-in tokens whose ratio lies outside [1-ε_low, 1+ε_high].
    logp, old_logp, mask: (B, T); adv: (B,).
    """
    m, ratio, a = _ratio(logp, old_logp, adv, mask)
    weight = ratio.clamp(1 - eps_low, 1 + eps_high).detach()
    loss_tok = -weight * a * logp
    loss = aggregate(loss_tok, m, agg, seq_weights=seq_weights, num_tokens=num_tokens)
    clipped = (ratio < 1 - eps_low) | (ratio > 1 + eps_high)
    return loss, _ratio_metrics(ratio, m, clipped)


# ---- extractor credit assignment (docs/design.md §3.2) ------------------------------------------------


def experience_reward(success: bool) -> float:
    """r(m, τ): +1 when a trajectory guided by entry m succeeded, -1 when it failed."""
    return 1.0 if success else -1.0


def generation_rewards(outcomes: Iterable[tuple[K, float]]) -> dict[K, float]:
    """Mean experience reward per generation: r̄(m) = mean over the trajectories τ it guided of r(m, τ).

    ``outcomes``: (generation id, r(m, τ)) pairs, one per guided trajectory (see ``experience_reward``).
    Returns {generation id: mean reward}, in order of first appearance.
    """
    sums: dict[K, float] = {}
    counts: dict[K, int] = {}
    for gen_id, r in outcomes:
        sums[gen_id] = sums.get(gen_id, 0.0) + float(r)
        counts[gen_id] = counts.get(gen_id, 0) + 1
    return {gen_id: sums[gen_id] / counts[gen_id] for gen_id in sums}


def extractor_advantages(mean_rewards: torch.Tensor) -> torch.Tensor:
    """Â_i = r̄(m_i) - mean over the training buffer of r̄ (no std division, docs/design.md §3.2).
    (N,) -> (N,)."""
    return mean_rewards - mean_rewards.mean()


def training_count_weight(
    step: int, last_trained_step: int | None, train_count: int, *, delta: int = 1, alpha: float = 0.5
) -> float:
    """Training-count-aware reweighting of a generation's advantage (docs/design.md §3.2).

    w = 0 if (t - t_last) < δ, else (1 + c_train)^(-α); a generation never trained on gets w = 1.
    ``step`` is the current extractor step t, ``last_trained_step`` t_last (None = never trained),
    ``train_count`` c_train, the number of updates that already used this generation.
    """
    if last_trained_step is None or train_count == 0:
        return 1.0
    if step - last_trained_step < delta:
        return 0.0
    return (1.0 + train_count) ** (-alpha)

"""Section 4, what the extractor did: its CISPO steps and their signal, each job's calls and the operations
that reached the bank (from the journals where the run kept one), and Search-and-Ask use."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.experiments.report.merges import merge_attempts
from trainer.experiments.report.render import fmt, pyplot, save_figure, step_axis, table
from trainer.experiments.report.runs import RunResult, by_arm
from trainer.experiments.stats import t_interval


def steps_after_warmup(r: RunResult) -> int:
    return max(max(r.train, default=0) - r.warmup, 0)


def applied_ops(changes: Sequence[dict[str, Any]], kind: str) -> int:
    """The extractor's operations of ``kind`` that reached the bank, from its history."""
    return sum(1 for c in changes if c.get("kind") == kind and c.get("actor", "extractor") == "extractor")


def extractor_rows(r: RunResult) -> dict[str, Any]:
    """The extractor's counts. From the journals where the run kept one (every attempt's work counted
    once: merge calls and passes from ``merges.jsonl``, unusable answers from the failures file, applied
    operations from ``changes.jsonl``); from the last metrics row otherwise (distillations, refinements,
    Return operations, CISPO)."""
    updates = r.last_train("extractor/updates")
    signal = r.last_train("extractor/updates_with_signal")
    after = steps_after_warmup(r)
    attempts = merge_attempts(r.merges)
    return {
        "run": r.slug,
        "cispo_steps": updates,
        "with_signal": signal,
        "steps_after_warmup": after,
        "signal_per_actor_step": signal / after if after else math.nan,
        "mean_adv_abs": r.last_train("extractor/adv_abs_sum") / updates if updates else math.nan,
        "mean_clip_frac": r.last_train("extractor/clip_frac_sum") / updates if updates else math.nan,
        "distil": r.last_train("extractor/distil_calls"),
        "merge": float(len(r.merges)),
        "merge_passes": float(len({step for step, _ in attempts})),
        "merge_attempts": float(len(attempts)),
        "merges_coalesced": r.last_train("extractor/merges_coalesced"),
        "refine": r.last_train("extractor/refine_calls"),
        "parse_failures": float(len(r.failures)),
        "ops_add": float(applied_ops(r.changes, "add")),
        "ops_update": float(applied_ops(r.changes, "update")),
        "ops_return": r.last_train("extractor/ops_return"),
        **search_and_ask_use(r.episodes),
    }


def search_and_ask_use(episodes: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Search-and-Ask calls per training episode and the share of episodes that asked at least once."""
    n = len(episodes)
    calls = sum(int(e.get("searches") or 0) for e in episodes)
    asked = sum(1 for e in episodes if e.get("searches"))
    return {"search_and_ask": float(calls), "asks_per_episode": calls / n if n else math.nan,
            "episodes_asking": asked / n if n else math.nan}  # fmt: skip


def extractor_section(runs: Sequence[RunResult], out: Path) -> str:
    rs = [r for r in runs if r.uses_experience]
    if not rs:
        return "## 4. What the extractor did\n\nNo run used the extractor.\n"
    rows = [extractor_rows(r) for r in rs]
    lines = [
        "## 4. What the extractor did",
        "",
        "CISPO steps taken, and those with non-zero advantages; per actor step after warm-up (target ≥ 0.5); "
        "mean |Â| and clip fraction over its steps; calls of each job; merge passes (attempts, where a crash "
        "cut one short and the resumed run ran it again; requests dropped because a pass was still "
        "waiting); unusable answers; operations applied; Search-and-Ask calls per training episode and the "
        "share of episodes that asked. Merge calls, passes, unusable answers, add and update come from the "
        "journals (`merges.jsonl`, `extractor_failures.jsonl`, `changes.jsonl`: every attempt's work, "
        "once); distil, refine, return and CISPO from the last metrics row (a crash loses what its attempt "
        "counted after its checkpoint). Buffer fill per step: `extractor/buffer` in the metrics (plotted).",
        "",
    ]
    lines += [table(EXTRACTOR_HEADER, map(_extractor_table_row, rows)), "", *signal_rate_lines(rs)]
    _plot_extractor(rs, out / "extractor.png")
    return "\n".join([*lines, "", "![extractor](extractor.png)", ""])


EXTRACTOR_HEADER = [
    "run",
    "CISPO steps",
    "with signal",
    "per actor step",
    "mean abs adv",
    "clip frac",
    "distil",
    "merge",
    "passes (attempts; coalesced)",
    "refine",
    "unusable answers",
    "add",
    "update",
    "return",
    "search&ask per episode (share asking)",
]


def _extractor_table_row(x: dict[str, Any]) -> list[str]:
    """``extractor_rows``'s counts as the section's table shows them."""
    counts = [fmt(x[k], 0) for k in ("cispo_steps", "with_signal")]
    means = [fmt(x["signal_per_actor_step"], 2), fmt(x["mean_adv_abs"]), fmt(x["mean_clip_frac"])]
    passes = f"{fmt(x['merge_passes'], 0)} ({fmt(x['merge_attempts'], 0)}; {fmt(x['merges_coalesced'], 0)})"
    jobs = [fmt(x["distil"], 0), fmt(x["merge"], 0), passes, fmt(x["refine"], 0)]
    ops = [fmt(x[k], 0) for k in ("parse_failures", "ops_add", "ops_update", "ops_return")]
    asks = f"{fmt(x['asks_per_episode'], 2)} ({fmt(x['episodes_asking'], 2)})"
    return [x["run"], *counts, *means, *jobs, *ops, asks]


def _plot_extractor(rs: Sequence[RunResult], path: Path) -> None:
    """πϕ's buffer fill and its CISPO steps with signal, per run against actor step."""
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 3.5))
    for r in rs:
        axes[0].plot(*r.train_series("extractor/buffer"), marker=".", label=r.slug)
        axes[1].plot(*r.train_series("extractor/updates_with_signal"), marker=".", label=r.slug)
    axes[0].set_title("buffer fill (generations waiting)")
    axes[1].set_title("CISPO steps with signal (cumulative)")
    for ax in axes:
        step_axis(ax)
    axes[1].legend(fontsize=7)
    save_figure(fig, path)


def signal_rate_lines(rs: Sequence[RunResult]) -> list[str]:
    """Per arm, the criterion over all its runs: CISPO steps with signal per actor step after warm-up,
    pooled (sum over sum) and as the mean of the runs' rates with its t-interval over seeds."""
    out = []
    for arm, runs in by_arm(rs).items():
        rows = [extractor_rows(r) for r in runs]
        signal = sum(x["with_signal"] for x in rows)
        after = sum(x["steps_after_warmup"] for x in rows)
        rates = [x["signal_per_actor_step"] for x in rows if math.isfinite(x["signal_per_actor_step"])]
        pooled = fmt(signal / after, 2) if after else "–"
        out.append(
            f"- {arm}: {fmt(signal, 0)} CISPO steps with signal over {after} actor steps after warm-up "
            f"= {pooled} pooled; per run {t_interval(rates)} (mean ± 95% t over {len(rates)} runs)."
        )
    return out

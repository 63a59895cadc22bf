"""Sections 1 and 2: evaluation success against step, and the final evaluation in the paper's Table 1
layout with the differences between arms and between columns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.experiments.report.render import fmt, pyplot, save_figure, step_axis, table
from trainer.experiments.report.runs import COLUMNS, WITH, RunResult, by_arm, env_names
from trainer.experiments.stats import (
    Interval,
    area_under_curve,
    steps_to_reach,
    t_interval,
    welch_interval,
    wilson_interval,
)


def curve(runs: Sequence[RunResult], key: str) -> tuple[list[int], list[Interval]]:
    """Mean over seeds with a 95% t-interval at every eval step that all runs of the arm reached."""
    steps = sorted(set.intersection(*(set(r.eval_series(key)[0]) for r in runs))) if runs else []
    return steps, [t_interval([r.evals[s][key] for r in runs]) for s in steps]


def eval_section(runs: Sequence[RunResult], out: Path) -> tuple[str, list[dict[str, Any]]]:
    """Section 1, and ``summary.csv``'s rows: each run's final evaluation per column."""
    arms = by_arm(runs)
    finals = [final for r in runs for col, label in COLUMNS if (final := final_eval(r, col, label))]
    arm_rows = [
        row for arm, rs in arms.items() for col, label in COLUMNS if (row := _arm_row(arm, rs, col, label))
    ]
    lines = [
        "## 1. Evaluation success vs step",
        "",
        "Greedy episodes on the frozen eval split. Mean over seeds ± the 95% Student-t half-width "
        "(n = seeds); AUC = area under the success curve over the run's step range (its mean success); "
        "steps to 50% / 75% from the seed-mean curve. Per run, the Wilson 95% interval over its eval "
        "episodes. The plot clips the bands to [0, 1].",
        "",
        table(["arm", "column", "final success", "AUC", "steps to 50%", "steps to 75%", "seeds"], arm_rows),
        "",
        "Per run (final eval, Wilson 95% over its episodes):",
        "",
        table(["run", "column", "step", "success", "Wilson 95%", "episodes", "AUC"], map(_run_row, finals)),
    ]
    _plot_eval(arms, out / "eval_success.png")
    lines += ["", "![eval success](eval_success.png)", "", training_speed_section(runs)]
    return "\n".join(lines), finals


def _arm_row(arm: str, rs: Sequence[RunResult], col: str, label: str) -> list[Any] | None:
    """An arm's column: final success and AUC over seeds, and the steps its seed-mean curve took."""
    key = f"eval/{col}success"
    steps, ivs = curve(rs, key)
    if not steps:
        return None
    means = [iv.mean for iv in ivs]
    aucs = t_interval([area_under_curve(*r.eval_series(key)) for r in rs])
    reach = [fmt(steps_to_reach(steps, means, mark), 0) for mark in (0.5, 0.75)]
    return [arm, label, str(ivs[-1]), str(aucs), *reach, len(rs)]


def final_eval(r: RunResult, col: str, label: str) -> dict[str, Any] | None:
    """A run's last evaluation of column ``col`` with its Wilson interval and AUC (None: it has none)."""
    steps, values = r.eval_series(f"eval/{col}success")
    if not steps:
        return None
    n = int(r.evals[steps[-1]].get(f"eval/{col}episodes", 0))
    w = wilson_interval(values[-1] * n, n)
    return {
        "run": r.slug,
        "arm": r.arm,
        "seed": r.seed,
        "column": label,
        "final_step": steps[-1],
        "final_success": values[-1],
        "wilson_low": w.low,
        "wilson_high": w.high,
        "episodes": n,
        "auc": area_under_curve(steps, values),
        "final_actions": r.evals[steps[-1]].get(f"eval/{col}actions"),
    }


def _run_row(final: dict[str, Any]) -> list[Any]:
    wilson = f"[{fmt(final['wilson_low'])}, {fmt(final['wilson_high'])}]"
    success, auc = fmt(final["final_success"]), fmt(final["auc"])
    return [final["run"], final["column"], final["final_step"], success, wilson, final["episodes"], auc]


# the first training step whose success (over all K rollouts of its tasks) reaches each mark
TRAINING_MARKS = (("first success", 1e-9), ("training success ≥ 50%", 0.5), ("training success ≥ 90%", 0.9))


def first_steps(r: RunResult) -> list[int | None]:
    steps, values = r.train_series("train/success")
    return [steps_to_reach(steps, values, mark) for _, mark in TRAINING_MARKS]


def training_speed_section(runs: Sequence[RunResult]) -> str:
    labels = [label for label, _ in TRAINING_MARKS]
    arm_rows = [
        [arm, *map(_reached_by, zip(*(first_steps(r) for r in rs), strict=True))]
        for arm, rs in by_arm(runs).items()
    ]
    return "\n".join(
        [
            "### How soon training succeeds",
            "",
            "The first training step whose success over all its rollouts reaches each mark: mean ± 95% t "
            "over the seeds that reached it (how many did, of all). Where a reward is sparse, the first "
            "success is where GRPO's signal starts.",
            "",
            table(["arm", *labels], arm_rows),
            "",
            table(["run", *labels], [[r.slug, *(fmt(s, 0) for s in first_steps(r))] for r in runs]),
            "",
        ]
    )


def _reached_by(first: Sequence[int | None]) -> str:
    steps = [s for s in first if s is not None]
    if len(steps) < 2:
        return f"{steps[0] if steps else 'never'} ({len(steps)}/{len(first)})"
    return f"{t_interval(steps).format(1)} ({len(steps)}/{len(first)})"


def _plot_eval(arms: dict[str, list[RunResult]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (col, label) in zip(axes, COLUMNS, strict=True):
        for i, (arm, rs) in enumerate(arms.items()):  # one colour per arm in both panels
            steps, ivs = curve(rs, f"eval/{col}success")
            if not steps:
                continue
            color = f"C{i}"
            ax.plot(steps, [iv.mean for iv in ivs], marker="o", color=color, label=f"{arm} (n={len(rs)})")
            lows = [max(0.0, iv.low) if math.isfinite(iv.low) else iv.mean for iv in ivs]
            highs = [min(1.0, iv.high) if math.isfinite(iv.high) else iv.mean for iv in ivs]
            ax.fill_between(steps, lows, highs, alpha=0.2, color=color)
        ax.set_title(f"eval success, {label}")
        step_axis(ax)
        ax.set_ylim(-0.05, 1.05)
        if ax.lines:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("success (seed mean, 95% t-band)")
    save_figure(fig, path)


# ---- 2. Table 1 -------------------------------------------------------------------------------------


def table1_section(runs: Sequence[RunResult]) -> str:
    envs = env_names(runs)
    keys = [(f"{e}/", e) for e in envs] + [("", "average" if envs else "success")]
    header = ["arm"] + [
        f"{name} ({'w/' if col else 'w/o'} exp)"
        for name_key, name in keys
        for col, _ in COLUMNS
        for _ in [name_key]
    ]
    rows = []
    for arm, rs in by_arm(runs).items():
        row = [arm]
        for name_key, _ in keys:
            for col, _ in COLUMNS:
                key = f"eval/{col}{name_key}success"
                finals = final_values(rs, key)
                row.append(str(t_interval(finals)) if finals else "–")
        rows.append(row)
    return "\n".join(
        [
            "## 2. Final evaluation in the paper's Table 1 layout",
            "",
            "Success at each run's last eval, mean ± 95% t-half-width over seeds; 'w/o exp' for the "
            "baseline is its only column.",
            "",
            table(header, rows),
            "",
            differences_section(runs),
        ]
    )


def final_values(rs: Sequence[RunResult], key: str) -> list[float]:
    """Each run's value of ``key`` at its last eval that has it."""
    return [values[-1] for r in rs if (values := r.eval_series(key)[1])]


def differences_section(runs: Sequence[RunResult]) -> str:
    """Final success of each arm's columns minus the first arm's (Welch, unpaired), and with − without
    experience within an arm (paired per run)."""
    arms = by_arm(runs)
    reference, reference_runs = next(iter(arms.items()))
    base = final_values(reference_runs, "eval/success")
    rows = []
    for arm, rs in list(arms.items())[1:]:
        for col, label in COLUMNS:
            values = final_values(rs, f"eval/{col}success")
            if values and base:
                iv = welch_interval(values, base)
                rows.append(
                    _difference_row(f"{arm} ({label}) − {reference}", iv, f"{len(values)} vs {len(base)}")
                )
    for arm, rs in arms.items():
        gains = [row[f"eval/{WITH}success"] - row["eval/success"] for r in rs if (row := last_with_both(r))]
        if gains:
            rows.append(
                _difference_row(
                    f"{arm}: with − without experience", t_interval(gains), f"{len(gains)} paired"
                )
            )
    if not rows:
        return ""
    return "\n".join(
        [
            "### Differences in final success",
            "",
            f"Between arms: a column's final success minus {reference}'s, with Welch's 95% t-interval (seeds "
            "unpaired, variances unequal). Within an arm: with minus without experience at the same eval of "
            "the same run, with the 95% t-interval of the paired differences.",
            "",
            table(["comparison", "difference", "95% interval", "excludes 0", "seeds"], rows),
            "",
        ]
    )


def last_with_both(r: RunResult) -> dict[str, float] | None:
    steps = [s for s, row in r.evals.items() if "eval/success" in row and f"eval/{WITH}success" in row]
    return r.evals[max(steps)] if steps else None


def _difference_row(label: str, iv: Interval, seeds: str) -> list[str]:
    if math.isnan(iv.low):
        return [label, f"{iv.mean:+.3f}", "–", "–", seeds]
    excludes = "yes" if iv.low > 0 or iv.high < 0 else "no"
    return [label, f"{iv.mean:+.3f}", f"[{iv.low:+.3f}, {iv.high:+.3f}]", excludes, seeds]

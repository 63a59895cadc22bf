"""An experiment's report from its result files alone (no database): report.md, PNG plots, summary.csv and
summary.md (the generated block in docs/results.md, ``trainer.experiments.summary``).

    python -m trainer.experiments.report docs/experiments/room-random     # or: manage.py experiment report

Reads ``<folder>/runs/<cell>/`` as ``webapp.experiments.export_results`` writes them: ``cell.json``,
``config.json``, ``metrics.jsonl``, ``episodes.jsonl``, ``changes.jsonl``, ``merges.jsonl``,
``extractor_failures.jsonl`` (refusing a folder that holds two attempts of a row), and the hand labels
``<folder>/labels.jsonl``. Sections:

0. conditions and time: each cell's commit, CPU and versions, flags where an arm's cells differ, and its
   wall time split into training, interruptions and the extractor's tail (``trainer.experiments.conditions``);
1. eval success (with and without experience) vs step per arm: mean over seeds with a 95% t-band, each
   run's point with its Wilson interval over its eval episodes; area under the curve; steps to 50% / 75%;
2. the paper's Table 1 layout (per env and average, with/without experience) as mean ± 95% CI, and the
   differences: each arm minus the first (Welch), with minus without experience (paired per run);
3. what the experience did: guided vs free training success; per entry, success when retrieved minus the
   free rollouts' success on the same task instances (usefulness); guided rollouts beside the grpo run's
   rollouts of the same sampling seed while both actors are untrained; each merge pass's effect; the
   similarity of what was handed out; the bank as it was (``trainer.experiments.bank``), checked against
   the run's ``bank/size``, its hand-labelled quality and the mechanical rule's precision against it;
4. what the extractor did: CISPO steps, buffer fill, mean |advantage|, clip fraction, job counts from the
   journals (merge passes and attempts, unusable answers, applied operations), Search-and-Ask use;
5. cost: training time per phase (never wall time), the extractor's generated tokens beside the actor's.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import METHODS
from trainer.experiments.bank import LABELS_FILE, BankReplay, agreement, shares
from trainer.experiments.conditions import GAP_S, conditions, hours, mixed, time_account
from trainer.experiments.files import FAILURES_FILE, read_lines, repeated_rows
from trainer.experiments.stats import (
    Interval,
    area_under_curve,
    mcnemar_exact,
    steps_to_reach,
    t_interval,
    welch_interval,
    wilson_interval,
)

WITH = "with_exp/"
COLUMNS = (("", "without experience"), (WITH, "with experience"))


@dataclass
class RunResult:
    """One cell's result files, read back."""

    slug: str
    arm: str
    seed: int
    method: str
    config: dict[str, Any]
    train: dict[int, dict[str, float]]
    evals: dict[int, dict[str, float]]
    episodes: list[dict[str, Any]] = field(default_factory=list)
    """The training steps' episodes (``episodes.jsonl`` without the evaluations' rows)."""
    changes: list[dict[str, Any]] = field(default_factory=list)
    merges: list[dict[str, Any]] = field(default_factory=list)
    status: str = ""
    failures: list[dict[str, Any]] = field(default_factory=list)
    cell: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_experience(self) -> bool:
        return self.method != "grpo"

    @property
    def warmup(self) -> int:
        return int(self.config.get("experience", {}).get("warmup_steps", 0))

    def eval_series(self, key: str) -> tuple[list[int], list[float]]:
        steps = [s for s in sorted(self.evals) if key in self.evals[s]]
        return steps, [self.evals[s][key] for s in steps]

    def train_series(self, key: str) -> tuple[list[int], list[float]]:
        steps = [s for s in sorted(self.train) if key in self.train[s]]
        return steps, [self.train[s][key] for s in steps]

    def last_train(self, key: str, default: float = 0.0) -> float:
        _, values = self.train_series(key)
        return values[-1] if values else default


def load_results(folder: Path) -> list[RunResult]:
    """Every cell under ``folder/runs``, ordered by method (as in ``METHODS``), arm, then seed."""
    runs = []
    for d in sorted(p for p in (Path(folder) / "runs").iterdir() if p.is_dir()):
        if repeated := repeated_rows(d):
            raise ValueError(
                f"{d} holds rows of more than one attempt ({'; '.join(repeated)}): a report counts each "
                "step once; keep each step's last attempt (trainer.experiments.files.last_attempt, "
                "last_batches) before building it"
            )
        cell = json.loads((d / "cell.json").read_text()) if (d / "cell.json").exists() else {}
        config = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
        train, evals = {}, {}
        for row in read_lines(d / "metrics.jsonl"):
            (evals if row.get("kind") == "eval" else train)[int(row["step"])] = row
        arm, _, seed = (cell.get("cell") or d.name.replace("-s", "/s")).rpartition("/s")
        method = cell.get("method") or config.get("method", arm)
        runs.append(
            RunResult(
                d.name,
                arm,
                int(seed or 0),
                method,
                config,
                train,
                evals,
                [e for e in read_lines(d / "episodes.jsonl") if not e.get("eval")],
                read_lines(d / "changes.jsonl"),
                read_lines(d / "merges.jsonl"),
                cell.get("status", ""),
                read_lines(d / FAILURES_FILE),
                cell,
            )
        )
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(runs, key=lambda r: (order.get(r.method, 99), r.arm, r.seed))


def by_arm(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    out: dict[str, list[RunResult]] = {}
    for r in runs:
        out.setdefault(r.arm, []).append(r)
    return out


def env_names(runs: Sequence[RunResult]) -> list[str]:
    """Per-env eval keys (mixtures report ``eval/<env>/success``); empty for a single env."""
    names = set()
    for r in runs:
        for row in r.evals.values():
            for k in row:
                m = re.fullmatch(r"eval/(?:with_exp/)?([^/]+)/success", k)
                if m and m.group(1) != "with_exp":
                    names.add(m.group(1))
    return sorted(names)


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---- 1. eval curves ---------------------------------------------------------------------------------


def curve(runs: Sequence[RunResult], key: str) -> tuple[list[int], list[Interval]]:
    """Mean over seeds with a 95% t-interval at every eval step that all runs of the arm reached."""
    steps = sorted(set.intersection(*(set(r.eval_series(key)[0]) for r in runs))) if runs else []
    return steps, [t_interval([r.evals[s][key] for r in runs]) for s in steps]


def eval_section(runs: Sequence[RunResult], out: Path) -> tuple[str, list[dict[str, Any]]]:
    arms = by_arm(runs)
    lines = ["## 1. Evaluation success vs step", ""]
    lines.append(
        "Greedy episodes on the frozen eval split. Mean over seeds ± the 95% Student-t half-width "
        "(n = seeds); AUC = area under the success curve over the run's step range (its mean success); "
        "steps to 50% / 75% from the seed-mean curve. Per run, the Wilson 95% interval over its eval "
        "episodes. The plot clips the bands to [0, 1]."
    )
    rows, summary = [], []
    for arm, rs in arms.items():
        for col, label in COLUMNS:
            key = f"eval/{col}success"
            steps, ivs = curve(rs, key)
            if not steps:
                continue
            means = [iv.mean for iv in ivs]
            aucs = t_interval([area_under_curve(*r.eval_series(key)) for r in rs])
            rows.append(
                [
                    arm,
                    label,
                    str(ivs[-1]),
                    str(aucs),
                    _fmt(steps_to_reach(steps, means, 0.5), 0),
                    _fmt(steps_to_reach(steps, means, 0.75), 0),
                    len(rs),
                ]
            )
    lines += [
        "",
        _table(["arm", "column", "final success", "AUC", "steps to 50%", "steps to 75%", "seeds"], rows),
    ]
    lines += ["", "Per run (final eval, Wilson 95% over its episodes):", ""]
    per_run = []
    for r in runs:
        for col, label in COLUMNS:
            steps, values = r.eval_series(f"eval/{col}success")
            if not steps:
                continue
            n = int(r.evals[steps[-1]].get(f"eval/{col}episodes", 0))
            w = wilson_interval(values[-1] * n, n)
            per_run.append(
                [
                    r.slug,
                    label,
                    steps[-1],
                    _fmt(values[-1]),
                    f"[{_fmt(w.low)}, {_fmt(w.high)}]",
                    n,
                    _fmt(area_under_curve(steps, values)),
                ]
            )
            summary.append(
                {
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
            )
    lines += [_table(["run", "column", "step", "success", "Wilson 95%", "episodes", "AUC"], per_run)]
    _plot_eval(arms, out / "eval_success.png")
    lines += ["", "![eval success](eval_success.png)", "", training_speed_section(runs)]
    return "\n".join(lines), summary


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
            _table(["arm", *labels], arm_rows),
            "",
            _table(["run", *labels], [[r.slug, *(_fmt(s, 0) for s in first_steps(r))] for r in runs]),
            "",
        ]
    )


def _reached_by(first: Sequence[int | None]) -> str:
    steps = [s for s in first if s is not None]
    if len(steps) < 2:
        return f"{steps[0] if steps else 'never'} ({len(steps)}/{len(first)})"
    return f"{t_interval(steps).format(1)} ({len(steps)}/{len(first)})"


def _plot_eval(arms: dict[str, list[RunResult]], path: Path) -> None:
    plt = _pyplot()
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
        _step_axis(ax)
        ax.set_ylim(-0.05, 1.05)
        if ax.lines:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("success (seed mean, 95% t-band)")
    _save(fig, path)


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
            _table(header, rows),
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
        gains = [row[f"eval/{WITH}success"] - row["eval/success"] for r in rs if (row := _last_with_both(r))]
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
            _table(["comparison", "difference", "95% interval", "excludes 0", "seeds"], rows),
            "",
        ]
    )


def _last_with_both(r: RunResult) -> dict[str, float] | None:
    steps = [s for s, row in r.evals.items() if "eval/success" in row and f"eval/{WITH}success" in row]
    return r.evals[max(steps)] if steps else None


def _difference_row(label: str, iv: Interval, seeds: str) -> list[str]:
    if math.isnan(iv.low):
        return [label, f"{iv.mean:+.3f}", "–", "–", seeds]
    excludes = "yes" if iv.low > 0 or iv.high < 0 else "no"
    return [label, f"{iv.mean:+.3f}", f"[{iv.low:+.3f}, {iv.high:+.3f}]", excludes, seeds]


# ---- 3. what the experience did ---------------------------------------------------------------------


def guided_free_section(runs: Sequence[RunResult], out: Path) -> str:
    rs = [r for r in runs if r.uses_experience]
    if not rs:
        return "### Guided vs free training success\n\nNo run used experience.\n"
    lines = [
        "### Guided vs free training success",
        "",
        "Training rollouts of the same task instances: K/2 with the retrieved entry in the prompt (guided), "
        "K/2 without (free). Mean over each run's steps after warm-up.",
        "",
    ]
    rows = []
    for r in rs:
        g = [v for s, v in zip(*r.train_series("train/guided/success"), strict=True) if s > r.warmup]
        f = [v for s, v in zip(*r.train_series("train/free/success"), strict=True) if s > r.warmup]
        if g and f:
            rows.append(
                [
                    r.slug,
                    _fmt(sum(g) / len(g)),
                    _fmt(sum(f) / len(f)),
                    _fmt(sum(g) / len(g) - sum(f) / len(f)),
                ]
            )
    lines.append(_table(["run", "guided", "free", "guided − free"], rows))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for arm, group in by_arm(rs).items():
        for kind, style in (("guided", "-"), ("free", "--")):
            steps, ivs = _train_curve(group, f"train/{kind}/success")
            if steps:
                ax.plot(steps, [iv.mean for iv in ivs], style, label=f"{arm} {kind}")
    _step_axis(ax)
    ax.set_ylabel("training success (mean over seeds)")
    ax.legend(fontsize=8)
    ax.xaxis.get_major_locator().set_params(integer=True)
    _save(fig, out / "guided_free.png")
    return "\n".join([*lines, "", "![guided vs free](guided_free.png)", ""])


def _train_curve(runs: Sequence[RunResult], key: str) -> tuple[list[int], list[Interval]]:
    sets = [set(r.train_series(key)[0]) for r in runs]
    steps = sorted(set.intersection(*sets)) if sets else []
    return steps, [t_interval([r.train[s][key] for r in runs]) for s in steps]


def free_base_rates(episodes: Sequence[dict[str, Any]]) -> dict[tuple[int, int], float]:
    """Success of the free rollouts of each (step, task instance)."""
    acc: dict[tuple[int, int], list[float]] = defaultdict(list)
    for e in episodes:
        if not e["guided"]:
            acc[(e["step"], e["group"])].append(float(e["success"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def entry_usefulness(episodes: Sequence[dict[str, Any]]) -> dict[int, list[float]]:
    """Per entry: success − the free base rate of the same task instance, one value per guided use."""
    base = free_base_rates(episodes)
    out: dict[int, list[float]] = defaultdict(list)
    for e in episodes:
        key = (e["step"], e["group"])
        if e["guided"] and e.get("entry_id") is not None and key in base:
            out[e["entry_id"]].append(float(e["success"]) - base[key])
    return out


def entry_titles(changes: Sequence[dict[str, Any]]) -> dict[int, str]:
    titles: dict[int, str] = {}
    for c in changes:
        if c.get("title"):
            titles[c["entry"]] = c["title"]
    return titles


IMPORTED = "imported (written by a person)"
EXTRACTED = "written by the extractor"


def imported_entries(changes: Sequence[dict[str, Any]]) -> set[int]:
    """Entries that entered the bank from an imported file rather than from the extractor."""
    return {c["entry"] for c in changes if c.get("kind") == "import"}


def usefulness_by_origin(run: RunResult) -> dict[str, list[float]]:
    """The run's per-use usefulness values, split by where the used entry came from."""
    imported = imported_entries(run.changes)
    out: dict[str, list[float]] = {IMPORTED: [], EXTRACTED: []}
    for entry, values in entry_usefulness(run.episodes).items():
        out[IMPORTED if entry in imported else EXTRACTED].extend(values)
    return out


def origin_lines(runs: Sequence[RunResult]) -> list[str]:
    rows = []
    for r in runs:
        if not imported_entries(r.changes):
            continue
        for origin, values in usefulness_by_origin(r).items():
            rows.append([r.slug, origin, len(values), str(t_interval(values)) if values else "–"])
    if not rows:
        return []
    return [
        "",
        "By origin, in runs whose bank started from an imported file: usefulness over the guided uses of "
        "each kind of entry, mean ± 95% t over uses (uses of the same step share the actor and the "
        "instance, so the interval is a rough guide).",
        "",
        _table(["run", "entries", "guided uses", "usefulness"], rows),
    ]


def usefulness_section(runs: Sequence[RunResult]) -> str:
    rs = [r for r in runs if r.uses_experience and r.episodes]
    if not rs:
        return (
            "### Entries: success when retrieved vs the free base rate\n\nNo guided episode was recorded.\n"
        )
    lines = [
        "### Entries: success when retrieved vs the free base rate",
        "",
        "usefulness = mean over an entry's guided uses of (success − success of the free rollouts of "
        "the same task instance at the same step); > 0: the entry helped. Overall = over every guided use.",
        "",
    ]
    rows, best = [], []
    for r in rs:
        use = entry_usefulness(r.episodes)
        values = [v for vs in use.values() for v in vs]
        sims = [e["similarity"] for e in r.episodes if e.get("similarity") is not None]
        rows.append(
            [
                r.slug,
                len(use),
                len(values),
                _fmt(sum(values) / len(values) if values else None),
                sum(1 for vs in use.values() if sum(vs) / len(vs) > 0),
                _fmt(sum(sims) / len(sims) if sims else None),
            ]
        )
        titles = entry_titles(r.changes)
        for entry, vs in use.items():
            if len(vs) >= 3:
                best.append((sum(vs) / len(vs), len(vs), r.slug, entry, titles.get(entry, "")[:70]))
    lines.append(
        _table(
            [
                "run",
                "entries used",
                "guided uses",
                "overall usefulness",
                "entries > 0",
                "mean similarity handed out",
            ],
            rows,
        )
    )
    best.sort(reverse=True)
    if best:
        lines += ["", "Most and least useful entries with at least 3 uses:", ""]
        shown = best[:8] + [b for b in best[-4:] if b not in best[:8]]
        lines.append(
            _table(
                ["usefulness", "uses", "run", "entry", "title"],
                [[_fmt(u), n, s, e, _escape(t)] for u, n, s, e, t in shown],
            )
        )
    lines += origin_lines(rs)
    return "\n".join([*lines, ""])


def untrained_steps(r: RunResult) -> set[int]:
    """Steps whose rollouts still came from the initial actor: no earlier step trained a row."""
    steps = set()
    for s in sorted(r.train):
        steps.add(s)
        if r.train[s].get("actor/sequences", 1) > 0:
            break
    return steps


def slots(episodes: Sequence[dict[str, Any]]) -> dict[tuple[int, int, int], dict[str, Any]]:
    """Episodes by (step, task instance, rollout index k): k fixes the sampling seed
    (``trainer.loop.sample_tasks``), so the same key in two runs of one seed is the same random draw."""
    out: dict[tuple[int, int, int], dict[str, Any]] = {}
    count: dict[tuple[int, int], int] = defaultdict(int)
    for e in episodes:
        key = (e["step"], e["group"])
        out[(*key, count[key])] = e
        count[key] += 1
    return out


def same_slot_pairs(run: RunResult, baseline: RunResult) -> dict[str, int]:
    """``run``'s rollouts beside ``baseline``'s of the same slot, at the steps where both actors were still
    the initial one: replayed = slots without experience in ``run`` whose outcome and length equal the
    baseline's (the pairing's check); the guided slots with an entry in the prompt, by who succeeded."""
    steps = untrained_steps(run) & untrained_steps(baseline)
    mine, theirs = slots(run.episodes), slots(baseline.episodes)
    counts = dict.fromkeys(("steps", "plain", "replayed", "pairs", "both", "baseline", "guided"), 0)
    counts["steps"] = len(steps)
    for key, e in mine.items():
        b = theirs.get(key)
        if key[0] not in steps or b is None or not same_draw(e, b):
            continue
        if e.get("entry_id") is None:
            counts["plain"] += 1
            counts["replayed"] += (e["success"], e["actions"]) == (b["success"], b["actions"])
        else:
            counts["pairs"] += 1
            counts["both"] += e["success"] and b["success"]
            counts["baseline"] += b["success"] and not e["success"]
            counts["guided"] += e["success"] and not b["success"]
    return counts


def same_draw(e: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same env and task instance, and the same sampling seed where both logs record one (logs written
    before ``sample_seed`` was recorded pair by their slot alone)."""
    if (e.get("env"), e.get("seed")) != (b.get("env"), b.get("seed")):
        return False
    return None in (e.get("sample_seed"), b.get("sample_seed")) or e["sample_seed"] == b["sample_seed"]


def same_slot_section(runs: Sequence[RunResult]) -> str:
    title = "### Same slot, with and without the entry: the untrained actor"
    baselines = {r.seed: r for r in runs if r.method == "grpo" and r.episodes}
    pairs = [(r, baselines[r.seed]) for r in runs if r.uses_experience and r.seed in baselines]
    if not pairs:
        return f"{title}\n\nNo experience run has a grpo run of the same seed to pair with.\n"
    lines = [
        title,
        "",
        "Rollout k of a task instance samples with a seed fixed by (run seed, step, instance, k) in every "
        "arm, so until either actor trains a row, an experience run and the grpo run of its seed draw the "
        "same random numbers for the same slot. The slots without an entry in the prompt must then replay "
        "the grpo rollout (the pairing's check); the guided slots differ from it by the entry alone. Counts "
        "over those steps; p: exact McNemar test on the discordant pairs (only grpo succeeded vs only "
        "guided did).",
        "",
    ]
    rows, pooled = [], defaultdict(lambda: defaultdict(int))
    for r, b in pairs:
        c = same_slot_pairs(r, b)
        for k, v in c.items():
            pooled[r.arm][k] += v
        rows.append(_same_slot_row(r.slug, b.slug, c))
    if len(pairs) > len(pooled):
        rows += [_same_slot_row(f"{arm} (pooled)", "", c) for arm, c in pooled.items()]
    header = ["run", "paired with", "steps", "replayed", "guided pairs", "both", "only grpo", "only guided"]
    lines.append(_table([*header, "p"], rows))
    return "\n".join([*lines, ""])


def _same_slot_row(label: str, baseline: str, c: dict[str, int]) -> list[Any]:
    return [
        label,
        baseline,
        c["steps"],
        f"{c['replayed']} / {c['plain']}",
        c["pairs"],
        c["both"],
        c["baseline"],
        c["guided"],
        _fmt(mcnemar_exact(c["baseline"], c["guided"]) if c["pairs"] else None),
    ]


def merge_effects(run: RunResult, window: int = 5) -> list[dict[str, Any]]:
    """Per merge pass (step): usefulness of the entries it changed over the ``window`` steps before it vs
    that of the entries it produced over the ``window`` steps after it."""
    base = free_base_rates(run.episodes)

    def usefulness(ids: set[int], lo: int, hi: int) -> tuple[float | None, int]:
        vals = [
            float(e["success"]) - base[(e["step"], e["group"])]
            for e in run.episodes
            if e["guided"]
            and e.get("entry_id") in ids
            and lo < e["step"] <= hi
            and (e["step"], e["group"]) in base
        ]
        return (sum(vals) / len(vals) if vals else None), len(vals)

    by_step: dict[int, dict[str, set]] = defaultdict(lambda: {"in": set(), "out": set()})
    for m in run.merges:
        if m["decision"] == "changed":
            by_step[m["step"]]["in"] |= set(m["inputs"])
            by_step[m["step"]]["out"] |= set(m["outputs"])
    out = []
    for step, ids in sorted(by_step.items()):
        before, n_before = usefulness(ids["in"], step - window, step)
        after, n_after = usefulness(ids["out"], step, step + window)
        out.append(
            {
                "step": step,
                "inputs": len(ids["in"]),
                "outputs": len(ids["out"]),
                "before": before,
                "uses_before": n_before,
                "after": after,
                "uses_after": n_after,
            }
        )
    return out


def merge_section(runs: Sequence[RunResult]) -> str:
    rows = []
    for r in runs:
        if not r.merges:
            continue
        decisions = defaultdict(int)
        for m in r.merges:
            decisions[m["decision"]] += 1
        for e in merge_effects(r):
            rows.append(
                [
                    r.slug,
                    e["step"],
                    e["inputs"],
                    e["outputs"],
                    f"{_fmt(e['before'])} ({e['uses_before']})",
                    f"{_fmt(e['after'])} ({e['uses_after']})",
                ]
            )
        if not any(row[0] == r.slug for row in rows):
            rows.append(
                [
                    r.slug,
                    "–",
                    0,
                    0,
                    "no merge changed anything: " + ", ".join(f"{k} {v}" for k, v in decisions.items()),
                    "",
                ]
            )
    if not rows:
        return "### Merge passes\n\nNo merge pass ran.\n"
    return "\n".join(
        [
            "### Merge passes",
            "",
            "Each pass that changed the bank: usefulness (guided uses) of the entries it took in, over the 5 "
            "steps before it, vs of the entries it wrote, over the 5 steps after it.",
            "",
            _table(
                [
                    "run",
                    "step",
                    "entries in",
                    "entries out",
                    "usefulness before (uses)",
                    "usefulness after (uses)",
                ],
                rows,
            ),
            "",
        ]
    )


# ---- bank quality -----------------------------------------------------------------------------------


def bank_replay(r: RunResult) -> BankReplay:
    """The run's bank rebuilt in applied order, checked against its recorded ``bank/size``."""
    return BankReplay.of(r.changes, dict(zip(*r.train_series("bank/size"), strict=True)))


def label_lines(labels: Sequence[dict[str, Any]], finals: dict[str, Any]) -> list[str]:
    """The hand labels' verdict on the final banks, and the rule's precision and recall against them."""
    if not labels:
        return [
            f"No entry of this experiment was labelled by hand (`{LABELS_FILE}`): the rule's shares above "
            "are not validated and say nothing about quality."
        ]
    a = agreement(labels, finals)
    share = wilson_interval(a.useful, a.labelled)
    lines = [
        f"**Hand labels** (`{LABELS_FILE}`, rule in `docs/experiments/README.md`): {a.useful} of "
        f"{a.labelled} entries drawn from the final banks are useful (share {_fmt(share.mean)}, Wilson 95% "
        f"[{_fmt(share.low)}, {_fmt(share.high)}]). Against them the mechanical rule marks {a.marked} good, "
        f"{a.marked_useful} of them useful: precision {_fmt(a.precision)}, recall {_fmt(a.recall)}. The "
        "rule's share is therefore not a measure of quality; the labelled share is.",
    ]
    if a.stale:
        lines += ["", f"**STALE LABELS**: not in the final bank as labelled: {', '.join(a.stale)}."]
    return lines


def quality_section(runs: Sequence[RunResult], out: Path, labels: Sequence[dict[str, Any]] = ()) -> str:
    rs = [r for r in runs if r.changes]
    if not rs:
        return "### Bank quality\n\nNo bank entry was written.\n"
    lines = [
        "### Bank quality: the bank as it was, hand labels, and the mechanical rule beside them",
        "",
        "Each run's bank rebuilt from `changes.jsonl` in the order the changes were applied (their ids), "
        "checked against the `bank/size` the run recorded at every step: a step matches when the rebuilt "
        "bank passes through the recorded size after the previous step's point and before any change "
        "stamped with a later step. An entry is marked *good* by the mechanical rule if it names an action "
        "or a symbol/object of the environment (word lists in `trainer/experiments/bank.py`) and is not a "
        "duplicate (token Jaccard ≥ 0.8 with an entry of lower id): a screen, validated below against "
        "hand labels. Shares over the final bank (every change applied):",
        "",
    ]
    rows, warnings, finals = [], [], {}
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in rs:
        replay = bank_replay(r)
        banks, final = replay.banks()
        finals[r.slug] = final
        q = shares(final)
        last = max(replay.recorded, default=None)
        checked = f"{replay.checked - len(replay.mismatched)} / {replay.checked}" if replay.checked else "–"
        if replay.mismatched:
            warnings.append(
                f"**MISMATCH** {r.slug}: the rebuilt bank never has the recorded `bank/size` at steps "
                f"{', '.join(map(str, replay.mismatched))}."
            )
        rows.append(
            [
                r.slug,
                q["entries"],
                replay.recorded.get(last, "–") if last is not None else "–",
                checked,
                _fmt(q["action"]),
                _fmt(q["object"]),
                _fmt(q["duplicate"]),
                _fmt(q["good"]),
            ]
        )
        steps = sorted(banks)
        line = ax.plot(steps, [len(banks[s]) for s in steps], marker=".", label=f"{r.slug} rebuilt")[0]
        recorded = sorted(replay.recorded)
        ax.plot(recorded, [replay.recorded[s] for s in recorded], "x", color=line.get_color(), alpha=0.6)
    lines.append(
        _table(
            [
                "run",
                "final entries (rebuilt)",
                "bank/size at last step",
                "steps matching bank/size",
                "names an action",
                "names an object",
                "duplicates",
                "marked good",
            ],
            rows,
        )
    )
    if warnings:
        lines += ["", *warnings]
    lines += ["", *label_lines(labels, finals)]
    _step_axis(ax)
    ax.set_ylabel("entries (line: rebuilt; x: bank/size)")
    ax.legend(fontsize=7)
    _save(fig, out / "bank_quality.png")
    return "\n".join([*lines, "", "![bank size, rebuilt vs recorded](bank_quality.png)", ""])


# ---- 4. the extractor ---------------------------------------------------------------------------------


def steps_after_warmup(r: RunResult) -> int:
    return max(max(r.train, default=0) - r.warmup, 0)


def merge_attempts(merges: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """The merge passes as they ran, from the journal: (step that asked, chunks) per attempt. A pass's
    chunks count up from 0; a count that starts again at the same step is a second attempt of that pass
    (its first was cut short by a crash; its changes stayed in the bank)."""
    out: list[list[int]] = []
    last = None
    for m in merges:
        if last is None or m["step"] != last["step"] or m["chunk"] <= last["chunk"]:
            out.append([m["step"], 0])
        out[-1][1] += 1
        last = m
    return [(step, chunks) for step, chunks in out]


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
    lines.append(
        _table(
            [
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
            ],
            [
                [
                    x["run"],
                    _fmt(x["cispo_steps"], 0),
                    _fmt(x["with_signal"], 0),
                    _fmt(x["signal_per_actor_step"], 2),
                    _fmt(x["mean_adv_abs"]),
                    _fmt(x["mean_clip_frac"]),
                    _fmt(x["distil"], 0),
                    _fmt(x["merge"], 0),
                    f"{_fmt(x['merge_passes'], 0)} ({_fmt(x['merge_attempts'], 0)}; "
                    f"{_fmt(x['merges_coalesced'], 0)})",
                    _fmt(x["refine"], 0),
                    _fmt(x["parse_failures"], 0),
                    _fmt(x["ops_add"], 0),
                    _fmt(x["ops_update"], 0),
                    _fmt(x["ops_return"], 0),
                    f"{_fmt(x['asks_per_episode'], 2)} ({_fmt(x['episodes_asking'], 2)})",
                ]
                for x in rows
            ],
        )
    )
    lines += ["", *signal_rate_lines(rs)]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    for r in rs:
        axes[0].plot(*r.train_series("extractor/buffer"), marker=".", label=r.slug)
        axes[1].plot(*r.train_series("extractor/updates_with_signal"), marker=".", label=r.slug)
    axes[0].set_title("buffer fill (generations waiting)")
    axes[1].set_title("CISPO steps with signal (cumulative)")
    for ax in axes:
        _step_axis(ax)
    axes[1].legend(fontsize=7)
    _save(fig, out / "extractor.png")
    return "\n".join([*lines, "", "![extractor](extractor.png)", ""])


def signal_rate_lines(rs: Sequence[RunResult]) -> list[str]:
    """Per arm, the criterion over all its runs: CISPO steps with signal per actor step after warm-up,
    pooled (sum over sum) and as the mean of the runs' rates with its t-interval over seeds."""
    out = []
    for arm, runs in by_arm(rs).items():
        rows = [extractor_rows(r) for r in runs]
        signal = sum(x["with_signal"] for x in rows)
        after = sum(x["steps_after_warmup"] for x in rows)
        rates = [x["signal_per_actor_step"] for x in rows if math.isfinite(x["signal_per_actor_step"])]
        pooled = _fmt(signal / after, 2) if after else "–"
        out.append(
            f"- {arm}: {_fmt(signal, 0)} CISPO steps with signal over {after} actor steps after warm-up "
            f"= {pooled} pooled; per run {t_interval(rates)} (mean ± 95% t over {len(rates)} runs)."
        )
    return out


# ---- 5. cost ------------------------------------------------------------------------------------------

PHASES = (
    ("rollout", "time/rollout_s", "sum"),
    ("actor backward", "time/backward_s", "sum"),
    ("old log-prob recompute", "time/recompute_s", "sum"),
    ("weight sync", "time/sync_s", "sum"),
    ("retrieval", "experience/retrieve_s", "last"),
    ("extractor distil", "extractor/distil_s", "last"),
    ("extractor merge", "extractor/merge_s", "last"),
    ("extractor training", "extractor/update_s", "last"),
)


def cumulative_total(values: Sequence[float]) -> float:
    """The total of a counter that runs up over a run's rows and starts again from zero when an attempt
    resumed without it: the sum of its rises, a fall counting from zero."""
    total, before = 0.0, 0.0
    for v in values:
        total += v - before if v >= before else v
        before = v
    return total


def cost_row(r: RunResult) -> dict[str, float]:
    row = {
        "steps": float(len(r.train)),
        "step time": sum(r.train_series("time/step_s")[1]),
        "evaluation": sum(r.eval_series("eval/time_s")[1]),
    }
    for name, key, how in PHASES:
        values = r.train_series(key)[1]
        row[name] = sum(values) if how == "sum" else cumulative_total(values)
    row["actor tokens"] = sum(r.train_series("rollout/generated_tokens")[1])
    row["extractor tokens"] = sum(
        r.last_train(f"extractor/{job}_tokens") for job in ("distil", "merge", "refine")
    )
    return row


def cost_section(runs: Sequence[RunResult]) -> tuple[str, list[dict[str, Any]]]:
    cols = ["step time", "evaluation"] + [p[0] for p in PHASES] + ["actor tokens", "extractor tokens"]
    rows, summary = [], []
    for arm, rs in by_arm(runs).items():
        costs = [cost_row(r) for r in rs]
        rows.append([arm, len(rs)] + [_fmt(sum(c[k] for c in costs) / len(costs), 0) for k in cols])
        summary += [{"run": r.slug, **c} for r, c in zip(rs, costs, strict=True)]
    caveats = [
        f"- {arm}: CPU {note}: its mean {'mixes' if 'different' in note else 'may mix'} machines of "
        "different speed."
        for arm, rs in by_arm(runs).items()
        if (note := mixed([conditions(r.cell)["cpu"] for r in rs]))
    ]
    lines = [
        "## 5. Cost",
        "",
        "Per run, mean over seeds: seconds the run spent in each phase, summed over its rows (step time and "
        "evaluation are the actor loop's own times: what it cost, with no interruption or restart in it; "
        "the extractor's phases run on a background thread beside the actor's, on the same cores) and "
        "generated tokens. Wall time is not a cost here: see Conditions and time. CPU seconds were not "
        "recorded. The paper reports no extractor cost.",
        "",
        _table(["arm", "seeds"] + cols, rows),
        "",
        *(["Where the cells of an arm ran on different CPUs (Conditions and time):", "", *caveats, ""]
          if caveats else []),
        _table(
            ["run", "CPU", "step time + evaluation", "actor tokens", "extractor tokens"],
            [
                [r.slug, conditions(r.cell)["cpu"], hours(c["step time"] + c["evaluation"]),
                 _fmt(c["actor tokens"], 0), _fmt(c["extractor tokens"], 0)]
                for r, c in ((r, cost_row(r)) for r in runs)
            ],
        ),
        "",
    ]  # fmt: skip
    return "\n".join(lines), summary


# ---- conditions ---------------------------------------------------------------------------------------


def conditions_section(runs: Sequence[RunResult]) -> str:
    """Per cell, what it ran under and where its wall time went; a flag for each arm whose cells differ."""
    rows, flags = [], []
    for r in runs:
        c = conditions(r.cell)
        t = time_account(list(r.train.values()) + list(r.evals.values()), r.cell)
        attempts = merge_attempts(r.merges)
        twice = len(attempts) - len({step for step, _ in attempts})
        pauses = ", ".join(f"{hours(g)} before {where}" for where, g in t["interruptions"]) or "none"
        rows.append(
            [r.slug, c["commit"], c["cpu"], c["native bf16"], c["threads"], c["resumed at steps"], c["torch"],
             c["vllm"], hours(t["wall"]),
             hours(t["trained"]), hours(t["tail"]), pauses, f"{twice}" if twice else "–", hours(t["other"])]
        )  # fmt: skip
    for arm, rs in by_arm(runs).items():
        for key in ("commit", "cpu"):
            if note := mixed([conditions(r.cell)[key] for r in rs]):
                flags.append(f"- **MIXED CONDITIONS** {arm}: {key}: {note}.")
    grid = [mixed([conditions(r.cell)[key] for r in runs]) for key in ("commit", "cpu")]
    lines = [
        "## Conditions and time",
        "",
        "What each cell ran under (`cell.json`: the commit, the processor's vector ISA and native bf16 where "
        "recorded; torch's threads and the steps its attempts resumed from, for cells trained since "
        "2026-12-04), and where its wall time went: *trained* = the steps' and "
        "evaluations' own seconds (what section 5 compares); *after the last eval* = until the last row, "
        "the extractor's queued work finishing (an interruption during it is inside); *interruptions* = "
        f"pauses between rows longer than {GAP_S / 60:.0f} min beyond the later row's own time (restarts, "
        "stopped machines); *passes run twice* = merge passes a crash cut short and the resumed run ran "
        "again (`merges.jsonl`); *other* = wall time left (start-up, time before the first row kept, short "
        "waits).",
        "",
        _table(
            [
                "run",
                "commit",
                "CPU",
                "native bf16",
                "threads",
                "resumed at steps",
                "torch",
                "vLLM",
                "wall",
                "trained",
                "after the last eval",
                "interruptions",
                "passes run twice",
                "other",
            ],
            rows,
        ),  # fmt: skip
        "",
    ]
    if flags:
        lines += [
            "Cells of one arm that ran under different code or hardware (their differences mix the method's "
            "effect with the conditions'; timings across CPU kinds do not compare):",
            "",
            *flags,
            "",
        ]
    else:
        lines += ["Every arm's cells ran under one commit and one recorded CPU kind.", ""]
    lines += [f"Over the whole grid: commit {grid[0] or 'one'}; CPU {grid[1] or 'one kind'}.", ""]
    return "\n".join(lines)


# ---- assembly -----------------------------------------------------------------------------------------


def build_report(folder: Path, out_dir: Path | None = None) -> Path:
    """Write ``report.md``, the plots and ``summary.csv`` into ``out_dir`` [folder/report]; returns it.
    ``trainer.experiments.summary.write_report`` adds the results page's summary beside them."""
    folder = Path(folder)
    out = Path(out_dir) if out_dir else folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    runs = load_results(folder)
    if not runs:
        raise ValueError(f"no runs under {folder / 'runs'}")
    eval_md, eval_rows = eval_section(runs, out)
    cost_md, cost_rows = cost_section(runs)
    experience = [
        guided_free_section(runs, out),
        usefulness_section(runs),
        same_slot_section(runs),
        merge_section(runs),
        quality_section(runs, out, read_lines(folder / LABELS_FILE)),
    ]
    parts = [
        f"# Experiment {folder.name}",
        "",
        f"Built from the result files in `{folder.name}/runs/` by `trainer.experiments.report`. "
        f"{len(runs)} runs; arms: {', '.join(f'{a} ({len(rs)} seeds)' for a, rs in by_arm(runs).items())}.",
        "",
        _table(
            ["run", "method", "status", "train steps", "eval steps"],
            [
                [
                    r.slug,
                    r.method,
                    r.status or "?",
                    max(r.train, default=0),
                    ", ".join(map(str, sorted(r.evals))),
                ]
                for r in runs
            ],
        ),
        "",
        conditions_section(runs),
        eval_md,
        table1_section(runs),
        "## 3. What the experience did",
        "",
        *experience,
        extractor_section(runs, out),
        cost_md,
    ]
    (out / "report.md").write_text("\n".join(parts), encoding="utf-8")
    _write_summary(out / "summary.csv", eval_rows, cost_rows)
    return out


def _write_summary(path: Path, eval_rows: list[dict[str, Any]], cost_rows: list[dict[str, Any]]) -> None:
    costs = {c["run"]: c for c in cost_rows}
    rows = [
        {**e, **{f"cost:{k}": v for k, v in costs.get(e["run"], {}).items() if k != "run"}} for e in eval_rows
    ]
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _step_axis(ax: Any) -> None:
    """An x-axis of actor steps: labelled, whole numbers only, a light grid."""
    ax.set_xlabel("actor step")
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m trainer.experiments.report docs/experiments/<name>", file=sys.stderr)
        return 2
    print(f"report: {build_report(Path(args[0])) / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

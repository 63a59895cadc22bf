"""The short summary of an experiment that the README includes (``report/summary.md``), and ``verify``.

Every figure the README states about an experiment comes from here: the README holds the summary between
``<!-- BEGIN generated: <path> -->`` and ``<!-- END generated -->`` markers and nothing else with numbers
about the grid. ``verify`` rebuilds the report from the run files into a temporary folder and lists every
difference from the committed report and from the README's copy of the summary, so a stale figure fails a
command (``manage.py experiment verify <name>``) and a test instead of landing.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from trainer.experiments.bank import LABELS_FILE, agreement
from trainer.experiments.conditions import conditions, hours, mixed, time_account
from trainer.experiments.report import build_report
from trainer.experiments.report.cost import cost_row
from trainer.experiments.report.evaluation import final_values, first_steps, last_with_both
from trainer.experiments.report.experience import entry_usefulness
from trainer.experiments.report.extractor import extractor_rows, signal_rate_lines, steps_after_warmup
from trainer.experiments.report.quality import bank_replay
from trainer.experiments.report.render import fmt, table
from trainer.experiments.report.runs import WITH, RunResult, by_arm, load_results
from trainer.experiments.report.same_slot import same_slot_pairs
from trainer.experiments.stats import mcnemar_exact, t_interval, welch_interval, wilson_interval
from trainer.runfiles import read_lines

SUMMARY_FILE = "summary.md"
PREREGISTRATION_FILE = "preregistration.json"
"""An experiment's pre-registered test (committed before its first run file): the report states its result."""
COMPARED = ("report.md", "summary.csv", SUMMARY_FILE)
"""The report's text files, compared line by line (the PNG plots are rebuilt but not compared: their bytes
depend on the matplotlib and FreeType versions, not on the figures)."""
MARK = re.compile(r"<!-- BEGIN generated: (?P<path>\S+) -->\n(?P<body>.*?)<!-- END generated -->", re.DOTALL)


def _frozen(r: RunResult) -> bool:
    return r.method in ("grpo", "static_online")


def _series(r: RunResult, col: str) -> str:
    steps, values = r.eval_series(f"eval/{col}success")
    return " / ".join(fmt(v) for v in values) if steps else "–"


def _final_wilson(r: RunResult, col: str) -> str:
    steps, values = r.eval_series(f"eval/{col}success")
    if not steps:
        return "–"
    n = int(r.evals[steps[-1]].get(f"eval/{col}episodes", 0))
    w = wilson_interval(values[-1] * n, n)
    return f"{fmt(values[-1])} [{fmt(w.low, 2)}, {fmt(w.high, 2)}]"


def _signal(r: RunResult) -> str:
    if _frozen(r):
        return "– (frozen extractor)" if r.uses_experience else "–"
    x = extractor_rows(r)
    return f"{fmt(x['with_signal'], 0)} / {steps_after_warmup(r)} = {fmt(x['signal_per_actor_step'], 2)}"


def cells_table(runs: Sequence[RunResult]) -> str:
    steps = sorted({s for r in runs for s in r.evals})
    rows = []
    for r in runs:
        marks = first_steps(r)
        rows.append(
            [r.cell.get("cell") or r.slug, _series(r, ""), _series(r, WITH), _final_wilson(r, ""),
             _final_wilson(r, WITH), *(f"step {s}" if s is not None else "never" for s in marks[::2]),
             _signal(r)]
        )  # fmt: skip
    header = [
        "cell",
        f"eval success without experience (steps {' / '.join(map(str, steps))})",
        "with experience",
        "final without, Wilson 95%",
        "final with",
        "first sampled success",
        "training success ≥ 90% from",
        "CISPO steps with signal / actor steps after warm-up",
    ]
    return table(header, rows)


def _iv(values: Sequence[float]) -> str:
    iv = t_interval(values)
    return fmt(iv.mean) if math.isnan(iv.low) else f"{fmt(iv.mean)} ± {fmt(iv.half_width)}"


def _bounds(low: float, high: float) -> str:
    return "–" if math.isnan(low) else f"[{low:+.2f}, {high:+.2f}]"


def arm_lines(runs: Sequence[RunResult]) -> list[str]:
    """Final success per arm over seeds, the differences between arms and within them, and whether any
    interval excludes zero."""
    arms = by_arm(runs)
    reference, base_runs = next(iter(arms.items()))
    base = final_values(base_runs, "eval/success")
    lines, excluding = [], []
    for arm, rs in arms.items():
        parts = []
        for col, label in (("", "without"), (WITH, "with")):
            values = final_values(rs, f"eval/{col}success")
            if values:
                parts.append(f"{_iv(values)} {label} (per seed {', '.join(fmt(v) for v in values)})")
        spread = final_values(rs, "eval/success")
        if spread:
            lines.append(
                f"- {arm}, final success over {len(rs)} seeds (mean ± 95% t): {'; '.join(parts)}; "
                f"seed spread {fmt(max(spread) - min(spread))}."
            )
    for arm, rs in list(arms.items())[1:]:
        for col, label in (("", "without"), (WITH, "with")):
            values = final_values(rs, f"eval/{col}success")
            if values and base:
                iv = welch_interval(values, base)
                interval = _bounds(iv.low, iv.high)
                lines.append(
                    f"- {arm} ({label} experience) − {reference}: {iv.mean:+.3f}, Welch 95% {interval}."
                )
                excluding += [f"{arm} ({label}) − {reference}"] if iv.low > 0 or iv.high < 0 else []
    for arm, rs in arms.items():
        gains = [row[f"eval/{WITH}success"] - row["eval/success"] for r in rs if (row := last_with_both(r))]
        if gains:
            iv = t_interval(gains)
            interval = _bounds(iv.low, iv.high)
            lines.append(f"- {arm}, with − without experience (paired per run): {iv.mean:+.3f} {interval}.")
            excluding += [f"{arm}: with − without"] if iv.low > 0 or iv.high < 0 else []
    lines.append(f"- Intervals that exclude zero: {', '.join(excluding) if excluding else 'none'}.")
    return lines


def experience_lines(runs: Sequence[RunResult], labels: Sequence[dict]) -> list[str]:
    """Guided vs free training success, usefulness, the bank as rebuilt, and the hand labels' verdict."""
    rs = [r for r in runs if r.uses_experience]
    if not rs:
        return []
    lines = []
    for arm, group in by_arm(rs).items():
        pairs, uses, banks = [], [], []
        for r in group:
            g = [v for s, v in zip(*r.train_series("train/guided/success"), strict=True) if s > r.warmup]
            f = [v for s, v in zip(*r.train_series("train/free/success"), strict=True) if s > r.warmup]
            if g and f:
                pairs.append(f"{fmt(sum(g) / len(g))} vs {fmt(sum(f) / len(f))} (s{r.seed})")
            values = [v for vs in entry_usefulness(r.episodes).values() for v in vs]
            uses.append(f"{fmt(sum(values) / len(values) if values else None)} (s{r.seed})")
            replay = bank_replay(r)
            banks.append(
                f"{replay.final_size} (s{r.seed}; {replay.checked - len(replay.mismatched)}/{replay.checked})"
            )
        lines.append(f"- {arm}: guided vs free training success after warm-up {', '.join(pairs)}.")
        lines.append(f"- {arm}: mean usefulness of a retrieved entry {', '.join(uses)}.")
        lines.append(
            f"- {arm}: final bank, rebuilt in applied order (steps matching the recorded bank/size): "
            f"{', '.join(banks)}."
        )
    if labels:
        finals = {r.slug: bank_replay(r).banks()[1] for r in rs}
        a = agreement(labels, finals)
        w = wilson_interval(a.useful, a.labelled)
        lines.append(
            f"- Hand labels ({LABELS_FILE}): {a.useful} of {a.labelled} final-bank entries useful "
            f"(Wilson 95% [{fmt(w.low)}, {fmt(w.high)}]); the mechanical rule marks {a.marked} of them "
            f"good, precision {fmt(a.precision)}, recall {fmt(a.recall)}."
        )
    return lines


def pairing_lines(runs: Sequence[RunResult]) -> list[str]:
    baselines = {r.seed: r for r in runs if r.method == "grpo" and r.episodes}
    pooled: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in runs:
        if r.uses_experience and r.seed in baselines:
            for k, v in same_slot_pairs(r, baselines[r.seed]).items():
                pooled[r.arm][k] += v
    return [
        f"- {arm} beside grpo, same slots while both actors were untrained: {c['replayed']} / {c['plain']} "
        f"unguided slots replayed; {c['pairs']} guided pairs, {c['both']} both succeed, {c['baseline']} only "
        f"grpo, {c['guided']} only guided (exact McNemar p = "
        f"{fmt(mcnemar_exact(c['baseline'], c['guided']) if c['pairs'] else None)})."
        for arm, c in pooled.items()
    ]


def conditions_table(runs: Sequence[RunResult]) -> str:
    """Per cell: the commit and CPU it ran under, its training time, its wall time and its interruptions."""
    rows = []
    for r in runs:
        c = conditions(r.cell)
        t = time_account(list(r.train.values()) + list(r.evals.values()), r.cell)
        pauses = ", ".join(hours(g) for _, g in t["interruptions"]) or "none"
        cell = r.cell.get("cell") or r.slug
        rows.append(
            [cell, c["commit"], c["cpu"], c["native bf16"], hours(t["trained"]), hours(t["wall"]), pauses]
        )
    header = ["cell", "commit", "CPU", "native bf16", "trained (steps + evals)", "wall", "interruptions"]
    return table(header, rows)


def cost_lines(runs: Sequence[RunResult]) -> list[str]:
    """The extractor's tokens beside the actor's per arm, and whether the conditions were held constant
    (the training times are in ``conditions_table``)."""
    lines = []
    for arm, rs in by_arm(runs).items():
        costs = [cost_row(r) for r in rs]
        actor = sum(c["actor tokens"] for c in costs)
        extractor = sum(c["extractor tokens"] for c in costs)
        if extractor and actor:
            lines.append(f"- {arm}: the extractor generated {extractor / actor:.1f}× the actor's tokens.")
    accounts = [time_account(list(r.train.values()) + list(r.evals.values()), r.cell) for r in runs]
    paused = sum(1 for t in accounts if t["interruptions"])
    commits = mixed([conditions(r.cell)["commit"] for r in runs])
    cpus = mixed([conditions(r.cell)["cpu"] for r in runs])
    lines.append(
        f"- Conditions: commit {commits or 'one for all cells'}; CPU {cpus or 'one kind'}; {paused} of "
        f"{len(runs)} cells were interrupted between rows. Compare cost on training time, never wall time."
    )
    return lines


def preregistered_lines(folder: Path, runs: Sequence[RunResult]) -> list[str]:
    """The pre-registered test's result, whatever it is, from ``preregistration.json``: the final success of
    one arm's column minus another's, Welch's interval over seeds; supported when the interval lies above
    zero, and undecided until every pre-registered seed of both arms has finished."""
    path = Path(folder) / PREREGISTRATION_FILE
    if not path.exists():
        return []
    test = json.loads(path.read_text())
    arms = by_arm(runs)
    sides = [(test["arm"], test["column"]), (test["reference"], test["reference_column"])]
    values = [
        final_values(arms.get(arm, []), f"eval/{WITH if col == 'with' else ''}success") for arm, col in sides
    ]
    (arm, col), (ref, ref_col) = sides
    what = f"{arm} ({col} experience) − {ref} ({ref_col} experience), final success"
    seeds = len(test["seeds"])
    head = f"- Pre-registered test ({PREREGISTRATION_FILE}): {what}, Welch {test['confidence']:.0%}"
    if min(len(v) for v in values) < seeds:
        done = ", ".join(f"{a} {len(v)}" for (a, _), v in zip(sides, values, strict=True))
        return [f"{head}: not decided yet (seeds finished of {seeds}: {done})."]
    iv = welch_interval(*values, confidence=test["confidence"])
    verdict = (
        "supported: the interval lies above zero"
        if iv.low > 0
        else "not supported: the interval reaches zero"
    )
    verdict = "contradicted: the interval lies below zero" if iv.high < 0 else verdict
    return [f"{head} over {seeds} seeds each: {iv.mean:+.3f} {_bounds(iv.low, iv.high)}, {verdict}."]


def summary_md(folder: Path, runs: Sequence[RunResult]) -> str:
    """The README's summary of the experiment in ``folder``: generated, never edited by hand."""
    name = Path(folder).name
    labels = read_lines(Path(folder) / LABELS_FILE)
    parts = [
        f"Generated from `docs/experiments/{name}/runs/` by `manage.py experiment report {name}` "
        f"(full report: [report.md](docs/experiments/{name}/report/report.md)); "
        f"`manage.py experiment verify {name}` checks it.",
        "",
        cells_table(runs),
        "",
        *preregistered_lines(folder, runs),
        *arm_lines(runs),
        *experience_lines(runs, labels),
        *pairing_lines(runs),
        *(
            f"- Extractor criterion (≥ 0.5 CISPO steps with signal per actor step after warm-up), {line[2:]}"
            for line in signal_rate_lines([r for r in runs if r.uses_experience and not _frozen(r)])
        ),
        *cost_lines(runs),
        "",
        conditions_table(runs),
        "",
    ]
    return "\n".join(parts)


# ---- verify -------------------------------------------------------------------------------------------


def _diff(name: str, committed: str, rebuilt: str, limit: int = 40) -> list[str]:
    lines = list(
        difflib.unified_diff(
            committed.splitlines(),
            rebuilt.splitlines(),
            f"committed {name}",
            f"rebuilt {name}",
            lineterm="",
            n=0,
        )
    )
    return lines[:limit] + ([f"... {len(lines) - limit} more diff lines"] if len(lines) > limit else [])


def compare_reports(committed: Path, rebuilt: Path) -> list[str]:
    """Differences between a committed report folder and a rebuilt one (text files, line by line; plots:
    present or not)."""
    out = []
    for name in COMPARED:
        old, new = committed / name, rebuilt / name
        if not old.exists():
            out.append(f"{old}: missing (the rebuild writes it)")
        elif (a := old.read_text(encoding="utf-8")) != (b := new.read_text(encoding="utf-8")):
            out += _diff(name, a, b)
    for png in sorted(p.name for p in rebuilt.glob("*.png")):
        if not (committed / png).exists():
            out.append(f"{committed / png}: missing (the rebuild draws it)")
    return out


def readme_blocks(readme: Path) -> dict[str, str]:
    """The generated blocks of a README: the path each includes → its text."""
    return {m["path"]: m["body"] for m in MARK.finditer(readme.read_text(encoding="utf-8"))}


def include_summary(readme: Path, summary_path: str, summary: str) -> bool:
    """Put ``summary`` into the README's block of ``summary_path`` (only between its markers); False when
    the README has no such block."""
    text = readme.read_text(encoding="utf-8")
    begin = f"<!-- BEGIN generated: {summary_path} -->\n"
    block = re.compile(re.escape(begin) + r".*?<!-- END generated -->", re.DOTALL)
    if not block.search(text):
        return False
    readme.write_text(block.sub(lambda _: f"{begin}{summary}<!-- END generated -->", text), encoding="utf-8")
    return True


def compare_readme(readme: Path, summary_path: str, summary: str) -> list[str]:
    """Differences between the README's copy of a summary and the summary; none if it does not include it."""
    blocks = readme_blocks(readme)
    if summary_path not in blocks:
        return [f"{readme}: no '<!-- BEGIN generated: {summary_path} -->' block: include the summary"]
    body = blocks[summary_path]
    return [] if body == summary else _diff(f"README block of {summary_path}", body, summary)


def write_report(folder: Path, out_dir: Path | None = None) -> Path:
    """The report (``report.build_report``) and ``summary.md`` beside it; returns the report's folder."""
    out = build_report(folder, out_dir=out_dir)
    (out / SUMMARY_FILE).write_text(summary_md(Path(folder), load_results(Path(folder))), encoding="utf-8")
    return out


def verify(folder: Path, readme: Path | None = None, summary_path: str | None = None) -> list[str]:
    """Rebuild ``folder``'s report into a temporary folder; every difference from the committed report
    (and, given ``readme``, from its block of the summary at ``summary_path``). Empty: it holds."""
    folder = Path(folder)
    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        rebuilt = write_report(folder, out_dir=Path(tmp))
        out = compare_reports(folder / "report", rebuilt)
        if readme is not None:
            out += compare_readme(readme, summary_path or str(folder / "report" / SUMMARY_FILE),
                                  (rebuilt / SUMMARY_FILE).read_text(encoding="utf-8"))  # fmt: skip
    return out

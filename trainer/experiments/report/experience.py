"""Section 3, what the experience did: guided against free training success, and how useful each entry was
when retrieved (against the free rollouts of the same task instance), by where the entry came from."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.experiments.report.render import escape, fmt, pyplot, save_figure, step_axis, table
from trainer.experiments.report.runs import RunResult, by_arm
from trainer.experiments.stats import Interval, t_interval


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
                    fmt(sum(g) / len(g)),
                    fmt(sum(f) / len(f)),
                    fmt(sum(g) / len(g) - sum(f) / len(f)),
                ]
            )
    lines.append(table(["run", "guided", "free", "guided − free"], rows))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for arm, group in by_arm(rs).items():
        for kind, style in (("guided", "-"), ("free", "--")):
            steps, ivs = _train_curve(group, f"train/{kind}/success")
            if steps:
                ax.plot(steps, [iv.mean for iv in ivs], style, label=f"{arm} {kind}")
    step_axis(ax)
    ax.set_ylabel("training success (mean over seeds)")
    ax.legend(fontsize=8)
    ax.xaxis.get_major_locator().set_params(integer=True)
    save_figure(fig, out / "guided_free.png")
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
        table(["run", "entries", "guided uses", "usefulness"], rows),
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
                fmt(sum(values) / len(values) if values else None),
                sum(1 for vs in use.values() if sum(vs) / len(vs) > 0),
                fmt(sum(sims) / len(sims) if sims else None),
            ]
        )
        titles = entry_titles(r.changes)
        for entry, vs in use.items():
            if len(vs) >= 3:
                best.append((sum(vs) / len(vs), len(vs), r.slug, entry, titles.get(entry, "")[:70]))
    lines.append(
        table(
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
            table(
                ["usefulness", "uses", "run", "entry", "title"],
                [[fmt(u), n, s, e, escape(t)] for u, n, s, e, t in shown],
            )
        )
    lines += origin_lines(rs)
    return "\n".join([*lines, ""])

"""Section 3, the merge passes: each pass's attempts from the journal, and the usefulness of the entries it
took in against that of the entries it wrote."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from trainer.experiments.report.experience import free_base_rates
from trainer.experiments.report.render import fmt, table
from trainer.experiments.report.runs import RunResult


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
                    f"{fmt(e['before'])} ({e['uses_before']})",
                    f"{fmt(e['after'])} ({e['uses_after']})",
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
            table(
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

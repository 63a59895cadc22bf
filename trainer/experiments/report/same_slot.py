"""Section 3, the same slot with and without the entry: while both actors are still the initial one, an
experience run and the grpo run of its seed draw the same random numbers for the same rollout slot, so
the guided slots differ from the baseline's by the entry alone."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from trainer.experiments.report.render import fmt, table
from trainer.experiments.report.runs import RunResult
from trainer.experiments.stats import mcnemar_exact


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
    lines.append(table([*header, "p"], rows))
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
        fmt(mcnemar_exact(c["baseline"], c["guided"]) if c["pairs"] else None),
    ]

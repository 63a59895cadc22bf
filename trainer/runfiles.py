"""The format of a run's files: the JSON lines its reporters write (``trainer.report``: ``metrics.jsonl``,
``episodes.jsonl``) and πϕ's failures file, read leniently, written atomically, and de-duplicated across
resumes. Experiment reports (``trainer.experiments.report``) and the web app read them back through here."""

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


def episode_batch(row: dict[str, Any]) -> tuple[bool, int]:
    """Which batch an ``episodes.jsonl`` row belongs to: (an evaluation's?, its step). Rows written before
    evaluations were logged have no ``eval``: training."""
    return bool(row.get("eval")), int(row["step"])


def batch_sizes(metrics: list[dict[str, Any]]) -> dict[tuple[bool, int], int]:
    """Episodes each batch of ``episodes.jsonl`` holds (``episode_batch``), for ``last_batches``: a step's
    ``train/episodes`` and an evaluation's ``episodes`` of both columns, from their metric rows."""
    sizes = {}
    for r in metrics:
        if r.get("kind") == "step" and "train/episodes" in r:
            sizes[(False, int(r["step"]))] = int(r["train/episodes"])
        elif r.get("kind") == "eval" and "eval/episodes" in r:
            sizes[(True, int(r["step"]))] = int(r["eval/episodes"] + r.get("eval/with_exp/episodes", 0))
    return sizes


def last_batches(episodes: list[dict[str, Any]], sizes: dict[tuple[bool, int], int]) -> list[dict[str, Any]]:
    """Episode rows with each batch once: a batch with more rows than it played keeps its last
    ``sizes[batch]`` (the attempt that the run went on from); batches without a size are kept as they are."""
    batches: dict[tuple[bool, int], list[dict[str, Any]]] = {}
    for row in last_attempt(episodes):
        batches.setdefault(episode_batch(row), []).append(row)
    out = []
    for batch, rows in batches.items():
        out += rows[-sizes[batch] :] if sizes.get(batch) else rows
    return out


def repeated_rows(folder: Path) -> list[str]:
    """What a run folder holds more than once: a (kind, step) of ``metrics.jsonl`` written twice, a step or
    an evaluation of ``episodes.jsonl`` with more rows than it played episodes. Empty for a clean folder."""
    folder = Path(folder)
    metrics = read_lines(folder / "metrics.jsonl")
    seen: dict[tuple, int] = {}
    for r in metrics:
        key = (r.get("kind", ""), r.get("step"))
        seen[key] = seen.get(key, 0) + 1
    out = [f"metrics.jsonl: {kind} {step} {n} times" for (kind, step), n in sorted(seen.items()) if n > 1]
    counts: dict[tuple[bool, int], int] = {}
    for e in read_lines(folder / "episodes.jsonl"):
        counts[episode_batch(e)] = counts.get(episode_batch(e), 0) + 1
    sizes = batch_sizes(metrics)
    out += [
        f"episodes.jsonl: {'the evaluation after ' if evaluation else ''}step {step} has {n} episodes, "
        f"it played {sizes[(evaluation, step)]}"
        for (evaluation, step), n in sorted(counts.items())
        if (evaluation, step) in sizes and n > sizes[(evaluation, step)]
    ]
    return out

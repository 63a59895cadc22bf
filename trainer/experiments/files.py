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
    step's rows are contiguous, so a block of a (kind, step) seen before replaces the earlier block.
    """
    blocks: dict[tuple, list[dict[str, Any]]] = {}
    current = None
    for row in rows:
        key = (row.get("kind", ""), row.get("step"))
        if key != current:
            blocks[key] = []
            current = key
        blocks[key].append(row)
    ordered = sorted(blocks.items(), key=lambda kv: (kv[0][1] if kv[0][1] is not None else -1, kv[0][0]))
    return [row for _, block in ordered for row in block]

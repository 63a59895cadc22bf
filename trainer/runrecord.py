"""``cell.json`` for a run trained from the command line (``python -m trainer.train --out DIR``).

A grid cell gets its ``cell.json`` from the database when it is exported (``webapp/experiments.py``); a run
outside the product has none, so the figures of a committed one-off run (``docs/experiments/lora-*``) could
not say what code and machine made them. This module writes the same record into the run folder: method,
env, seed, status, start and end, and one row per attempt (the step it started from, and its command,
commit, uncommitted files, CPU, threads and load: ``trainer.experiments.provenance``), so a run resumed under
other code shows it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainer.config import RunConfig
from trainer.experiments.provenance import provenance

CELL_FILE = "cell.json"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def read_record(out: Path) -> dict[str, Any] | None:
    path = Path(out) / CELL_FILE
    return json.loads(path.read_text()) if path.exists() else None


def _write(out: Path, record: dict[str, Any]) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / CELL_FILE).write_text(json.dumps(record, indent=1) + "\n")


def new_record(cfg: RunConfig) -> dict[str, Any]:
    return {
        "experiment": "",
        "cell": "",
        "run": None,
        "uid": str(uuid.uuid4()),
        "status": "running",
        "method": cfg.method,
        "env": cfg.env,
        "seed": cfg.seed,
        "started_at": _now(),
        "finished_at": None,
        "environment": {},
        "attempts": [],
    }


def start_attempt(out: Path, cfg: RunConfig, from_step: int, argv: Sequence[str]) -> dict[str, Any]:
    """Record an attempt starting at ``from_step`` (0 for a fresh run); the first attempt's provenance is
    also the run's ``environment`` (its ``code_version`` the commit that started it)."""
    record = read_record(out) or new_record(cfg)
    attempt = {"from_step": from_step, **provenance(argv)}
    if not record["attempts"]:
        record["environment"] = {"code_version": attempt["commit"], **attempt}
    record["attempts"].append(attempt)
    record["status"], record["finished_at"] = "running", None
    _write(out, record)
    return record


def finish(out: Path, status: str) -> None:
    """Mark the run ``succeeded`` or ``failed`` with its end time."""
    record = read_record(out)
    if record is not None:
        record["status"], record["finished_at"] = status, _now()
        _write(out, record)


def attempt_commits(record: dict[str, Any]) -> list[str]:
    """The distinct commits the run's attempts ran, in order: more than one means mixed code."""
    return list(dict.fromkeys(a["commit"] for a in record.get("attempts", [])))

"""The runs of an experiment read back from their result files: one ``RunResult`` per cell."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config import METHODS
from trainer.runfiles import FAILURES_FILE, read_lines, repeated_rows

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
                "step once; keep each step's last attempt (trainer.runfiles.last_attempt, "
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

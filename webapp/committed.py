"""Experiments whose results are committed under ``docs/experiments/``, read from their files alone.

A fresh database knows none of the project's own grids (they were trained on another machine), yet their
result files and reports travel with the checkout. These read-only views of them need no command and no row:
each folder ``docs/experiments/<name>/`` with a ``report/`` or finished cells under ``runs/`` is a committed
grid; its experiment file (``configs/experiments/*.toml`` whose ``name`` is that name) gives its description,
methods, seeds and budget where it is present.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.cache import cache
from django.urls import reverse

from trainer.experiments.spec import NAME
from trainer.runfiles import read_lines
from webapp.experiments import results_root

REPORT = Path("report") / "report.md"


@dataclass
class CommittedCell:
    """One finished cell as its committed files describe it."""

    slug: str
    arm: str
    seed: int
    status: str
    method: str
    env: str
    steps: int
    final_eval: dict[str, float]
    config: dict[str, Any]
    finished_at: str = ""

    @property
    def config_json(self) -> str:
        return json.dumps(self.config, indent=1, sort_keys=True)

    @property
    def success(self) -> float | None:
        return self.final_eval.get("eval/success")

    @property
    def success_with_experience(self) -> float | None:
        return self.final_eval.get("eval/with_exp/success")


@dataclass
class CommittedExperiment:
    """A grid known only from ``docs/experiments/<name>/``: never editable, never run from here."""

    name: str
    folder: Path
    description: str = ""
    spec_file: Path | None = None
    spec_text: str = ""
    spec: dict[str, Any] = field(default_factory=dict)

    committed = True

    @property
    def report_path(self) -> Path:
        return self.folder / REPORT

    @property
    def shown_folder(self) -> str:
        return shown_path(self.folder)

    @property
    def shown_spec_file(self) -> str:
        return shown_path(self.spec_file) if self.spec_file else ""

    @property
    def has_report(self) -> bool:
        return self.report_path.is_file()

    @property
    def updated_at(self) -> datetime | None:
        """When its report (or, without one, its folder) last changed in this checkout."""
        path = self.report_path if self.has_report else self.folder
        return datetime.fromtimestamp(path.stat().st_mtime).astimezone()

    @cached_property
    def cells(self) -> list[CommittedCell]:
        """Its finished cells, arm by arm in the experiment file's order, then by seed."""
        cells = [c for c in map(_cell, sorted((self.folder / "runs").glob("*/cell.json"))) if c is not None]
        order = {arm: i for i, arm in enumerate(self.arms or [])}
        return sorted(cells, key=lambda c: (order.get(c.arm, len(order)), c.arm, c.seed))

    @property
    def arms(self) -> list[str]:
        """The grid's rows as the experiment file names them ([] without the file)."""
        variants = [v.get("name", "") for v in self.spec.get("variants", []) if isinstance(v, dict)]
        return [str(m) for m in self.spec.get("methods", [])] + variants

    @property
    def cell_count(self) -> int:
        seeds = self.spec.get("seeds") or []
        return len(self.arms) * len(seeds) if self.arms and seeds else len(self.cells)

    @property
    def done(self) -> int:
        return sum(c.status == "succeeded" for c in self.cells)

    def get_absolute_url(self) -> str:
        return reverse("experiment_detail", args=[self.name])


def shown_path(path: Path) -> str:
    """A path as a user finds it: relative to the checkout where it lies inside it."""
    base = Path(settings.BASE_DIR)
    return str(path.relative_to(base) if path.is_relative_to(base) else path)


def committed_experiments(exclude: set[str] = frozenset()) -> list[CommittedExperiment]:
    """Every committed grid under the results folder, by name, except the folders in ``exclude`` (those
    the database has an experiment for: its own page shows them with their runs)."""
    root = results_root()
    if not root.is_dir():
        return []
    found = (committed_experiment(p.name) for p in sorted(root.iterdir()) if p.name not in exclude)
    return [e for e in found if e is not None]


def committed_experiment(name: str) -> CommittedExperiment | None:
    """The committed grid in folder ``name`` (a valid experiment name), or None if there is none."""
    if not NAME.match(name):
        return None
    folder = results_root() / name
    if not folder.is_dir() or not ((folder / REPORT).is_file() or any((folder / "runs").glob("*/cell.json"))):
        return None
    experiment = CommittedExperiment(name=name, folder=folder)
    spec_file = experiment_file(name)
    if spec_file is not None:
        experiment.spec_file = spec_file
        experiment.spec_text = spec_file.read_text(encoding="utf-8")
        experiment.spec = tomllib.loads(experiment.spec_text)
        experiment.description = str(experiment.spec.get("description", ""))
    return experiment


def experiment_file(name: str) -> Path | None:
    """The experiment file in ``configs/experiments/`` whose ``name`` is ``name`` (None if none is)."""
    for path in sorted((Path(settings.BASE_DIR) / "configs" / "experiments").glob("*.toml")):
        try:
            if tomllib.loads(path.read_text(encoding="utf-8")).get("name") == name:
                return path
        except (OSError, tomllib.TOMLDecodeError):
            continue
    return None


def _cell(record_path: Path) -> CommittedCell | None:
    """A cell from its ``cell.json`` (arm and seed from its key ``arm/sN``), its config and its last
    evaluation; None where the record cannot be read."""
    folder = record_path.parent
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        arm, seed = str(record["cell"]).rsplit("/s", 1)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError):
        return None
    rows = read_lines(folder / "metrics.jsonl")
    evals = [r for r in rows if r.get("kind") == "eval"]
    return CommittedCell(
        slug=folder.name,
        arm=arm,
        seed=int(seed),
        status=str(record.get("status", "")),
        method=str(record.get("method", "")),
        env=str(record.get("env", "")),
        steps=max((int(r.get("step", 0)) for r in rows if r.get("kind") == "step"), default=0),
        final_eval=evals[-1] if evals else {},
        config=config,
        finished_at=str(record.get("finished_at") or ""),
    )


CELL_SLUG = re.compile(r"^[A-Za-z0-9_.+-]{1,80}$")
"""A committed cell's folder under ``runs/`` (``grpo-s0``, ``static_online+oracle-s3``)."""


@dataclass
class CommittedRun:
    """A committed cell as the compare page draws a run: read-only, named and linked as committed. Its ``id``
    is its reference ``<grid>/<cell folder>``; its metric rows are its ``metrics.jsonl``."""

    id: str
    name: str
    method: str
    env: str
    seed: int
    config: dict[str, Any]
    url: str
    rows: list[dict[str, Any]]
    experiment_id: str = ""
    """``committed:<grid>``: seeds of one arm of it are grouped like an experiment's (``default_group``)."""
    cell: str = ""

    committed = True


def committed_run(ref: str) -> CommittedRun | None:
    """The committed cell ``<grid>/<cell folder>`` (``room-random/grpo-s0``), or None if there is none."""
    grid, _, slug = ref.partition("/")
    experiment = committed_experiment(grid) if CELL_SLUG.match(slug) else None
    cell = next((c for c in experiment.cells if c.slug == slug), None) if experiment else None
    if cell is None:
        return None
    rows = read_lines(experiment.folder / "runs" / slug / "metrics.jsonl")
    return CommittedRun(
        id=ref, name=f"{grid} {slug} (committed)", method=cell.method, env=cell.env, seed=cell.seed,
        config=cell.config, url=f"{experiment.get_absolute_url()}#cell-{slug}", rows=rows,
        experiment_id=f"committed:{grid}", cell=f"{cell.arm}/s{cell.seed}",
    )  # fmt: skip


def committed_baselines(env: str) -> list[tuple[str, str]]:
    """Each committed grid's finished grpo cells on ``env`` as (label, compare query), so a run of that env
    is put beside the published baseline in one click; cached a minute (it reads the grids' files)."""

    def find() -> list[tuple[str, str]]:
        found = []
        for experiment in committed_experiments():
            cells = [
                c for c in experiment.cells if c.env == env and c.arm == "grpo" and c.status == "succeeded"
            ]
            if cells:
                query = urlencode([("committed", f"{experiment.name}/{c.slug}") for c in cells])
                found.append((f"{experiment.name}: grpo × {len(cells)} seeds", query))
        return found

    return cache.get_or_set(f"studio:committed-baselines:{env}", find, BASELINES_CACHE_S)


BASELINES_CACHE_S = 60

"""Experiments in the database: a grid's runs, how each cell is run or resumed, and its result files.

An ``Experiment`` row mirrors an experiment file (``trainer.experiments.spec``); each cell of its grid is one
``Run`` (``run.experiment``, ``run.cell``), trained in its own folder ``var/experiments/<folder>/<cell>/``
(``Experiment.folder``: its name, unless another owner's experiment had it first) so a grid can be carried
across machine restarts: running it again skips finished cells, resumes unfinished ones from their last
checkpoint and restarts those that have none.

When a cell finishes (on a worker or in the foreground) its small result files are copied to
``docs/experiments/<folder>/runs/<cell>/`` (``results_dir``): the run's config, ``metrics.jsonl`` and
``episodes.jsonl`` (each step once, the last attempt's), and the bank's history from the database
(``changes.jsonl``, ``merges.jsonl``). Reports are built from those files alone
(``trainer.experiments.report``), so they can be committed and rebuilt without the database.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from experience.models import Experience, ExperienceChange, Merge
from experience.services import experience_import
from trainer.checkpoint import UNSET, config_changes, flat_config
from trainer.config import ConfigError, RunConfig
from trainer.experiments.spec import Cell, ExperimentSpec
from trainer.paths import var_dir
from trainer.rollout.base import native_bf16
from trainer.runfiles import (
    FAILURES_FILE,
    batch_sizes,
    last_attempt,
    last_batches,
    read_lines,
    write_lines,
)
from webapp.models import Experiment, Run
from webapp.queueing import run_enqueue_on_commit
from webapp.supervisor import claim_and_train


def results_root() -> Path:
    """Where experiments' result files and reports go (``docs/experiments`` in the checkout)."""
    return Path(settings.EXPERIMENT_RESULTS_DIR)


def results_dir(folder: str) -> Path:
    """An experiment's result files and report (``Experiment.folder``)."""
    return results_root() / folder


def cell_dir(folder: str, cell: Cell) -> Path:
    """The training folder of a cell: checkpoints, logs and metrics while it runs."""
    return var_dir() / "experiments" / folder / cell.slug


@dataclass
class CellState:
    cell: Cell
    run: Run | None
    committed: Path | None = None

    @property
    def status(self) -> str:
        if self.run:
            return self.run.display_status
        return "succeeded (committed results)" if self.committed else "not started"


def _lock(key: str) -> None:
    """Serialise writers of ``key`` until the current transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [key])


def experiment_name_taken(owner, name: str) -> bool:
    """Whether ``owner`` has an experiment called ``name`` (others' names never count: each owner names
    experiments in a namespace of their own). Call inside a transaction: holds a lock on the name until it
    ends, so two launches of one name are serialised."""
    _lock(f"experiment:{owner.pk}:{name}")
    return Experiment.objects.filter(owner=owner, name=name).exists()


def experiment_folder(name: str, owner) -> str:
    """The folder a new experiment of ``owner`` called ``name`` gets: its name, or ``name--<owner id>`` when
    another owner's experiment has that folder (two grids never train into one folder)."""
    _lock(f"experiment-folder:{name}")
    return f"{name}--{owner.pk}" if Experiment.objects.filter(folder=name).exists() else name


@transaction.atomic
def experiment_sync(spec: ExperimentSpec, owner, *, shared: bool = True) -> Experiment:
    """``owner``'s experiment of this name, created or brought up to date with its file."""
    fields = {"description": spec.description, "spec": spec.to_dict(), "source": str(spec.source or "")}
    experiment = Experiment.objects.filter(owner=owner, name=spec.name).first()
    if experiment is None:
        folder = experiment_folder(spec.name, owner)
        return Experiment.objects.create(name=spec.name, owner=owner, shared=shared, folder=folder, **fields)
    Experiment.objects.filter(pk=experiment.pk).update(**fields)
    experiment.refresh_from_db()
    return experiment


def experiment_grid(experiment: Experiment, user) -> list[dict]:
    """The page's grid from the stored spec: one row per arm, one cell per seed, each with its run if this
    user may see it (a hidden run shows as its state only) or, without a run here, whether its finished
    results are committed."""
    spec = experiment.spec
    runs = {r.cell: r for r in experiment.runs.all()}
    visible = set(Run.objects.visible_to(user).filter(experiment=experiment).values_list("pk", flat=True))
    committed = committed_cells(experiment)
    rows = []
    for arm in experiment.arms:
        cells = []
        for seed in spec.get("seeds", []):
            key = f"{arm}/s{seed}"
            run = runs.get(key)
            visible_run = run is not None and run.pk in visible
            cells.append({"seed": seed, "run": run, "visible": visible_run, "committed": key in committed})
        rows.append({"arm": arm, "cells": cells})
    return rows


def committed_cells(experiment: Experiment) -> set[str]:
    """Keys of the cells that have no run in this database but finished results committed under their
    config (``committed_cell``). Empty where the stored grid is one this code can no longer read."""
    try:
        spec = ExperimentSpec.from_stored(experiment.spec)
    except ConfigError:
        return set()
    return {s.cell.key for s in experiment_cells(experiment, spec) if s.committed}


def experiment_cells(experiment: Experiment | None, spec: ExperimentSpec) -> list[CellState]:
    """Every cell of the grid with its run (None: not started yet; every cell of an experiment not run)."""
    runs = {r.cell: r for r in experiment.runs.all()} if experiment is not None else {}
    states = [CellState(c, runs.get(c.key)) for c in spec.cells()]
    for state in states:
        if state.run is None:
            state.committed = committed_cell(experiment.folder if experiment else spec.name, state.cell)
    return states


def committed_cell(folder_name: str, cell: Cell) -> Path | None:
    """The result folder of ``cell`` (of the experiment whose folder is ``folder_name``) when it holds a
    finished run under the cell's config: results committed on a machine whose database is gone (``var/``
    does not travel; ``docs/experiments`` does)."""
    folder = results_dir(folder_name) / "runs" / cell.slug
    try:
        record = json.loads((folder / "cell.json").read_text())
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if record.get("status") != Run.Status.SUCCEEDED or _drift(config, cell):
        return None
    return folder


def cell_run(experiment: Experiment, cell: Cell, owner, *, launch_token: str = "") -> Run:
    """The run of ``cell``: its own, a run started by hand in the cell's folder (adopted), or a new one."""
    run = experiment.runs.filter(cell=cell.key).first()
    if run is not None:
        return run
    folder = str(cell_dir(experiment.folder, cell))
    with transaction.atomic():
        run = (
            Run.objects.filter(checkpoint_dir=folder, experiment__isnull=True).order_by("-created_at").first()
        )
        if run is not None:
            Run.objects.filter(pk=run.pk).update(experiment=experiment, cell=cell.key)
            run.refresh_from_db()
            return run
        run = Run.objects.create(
            name=f"{experiment.name} {cell.key}",
            owner=owner,
            shared=experiment.shared,
            tags=[experiment.name, cell.arm],
            method=cell.config.method,
            env=cell.config.env,
            seed=cell.seed,
            config=cell.config.to_dict(),
            checkpoint_dir=folder,
            experiment=experiment,
            cell=cell.key,
            launch_token=launch_token,
        )
    if cell.bank is not None:
        seed_bank(run, cell.bank)
    return run


def seed_bank(run: Run, path: Path) -> int:
    """Load a variant's starting bank (the bank's JSONL export format) into a new cell's run."""
    if Experience.objects.filter(run=run).exists():
        return 0
    with path.open(encoding="utf-8") as lines:
        return experience_import(run, lines)


def config_drift(run: Run, cell: Cell) -> str:
    """How the config a cell's run was started under differs from the cell's config in the file now ("" if
    it does not): a run's results compare with its neighbours' only under the same config. A method without
    experience (grpo) never reads the extractor's and the bank's settings, so their changes do not count."""
    return _drift(run.config, cell)


def _drift(config: dict, cell: Cell) -> str:
    """The cell's settings that differ from ``config``'s (what a run or committed result trained under). A
    setting added since counts only where the cell sets it off its default: a new setting's default is the
    behaviour the code had before it (as when a checkpoint resumes, ``read_checkpoint``)."""
    defaults = flat_config(RunConfig().to_dict())
    changes = [
        (key, then, now)
        for key, then, now in config_changes(config, cell.config.to_dict())
        if not (then is UNSET and key in defaults and now == defaults[key])
    ]
    if not cell.config.uses_experience:
        changes = [c for c in changes if not c[0].startswith(("extractor.", "experience."))]
    return "; ".join(f"{key}: {then!r} then, {now!r} now" for key, then, now in changes)


def cell_restart(run: Run) -> Run:
    """Take ``run`` out of its cell so that the cell starts again from scratch; nothing is deleted.

    The old run stays in the runs list as "<name> (replaced)" with its bank, episodes and metrics; its
    folder moves aside (``<cell>.replaced-run<pk>``); its exported result files leave the experiment's
    results (git keeps them). A live run is refused: cancel it first.
    """
    if run.status == Run.Status.RUNNING and not run.is_lost:
        raise ValueError(f"run {run.pk} of cell {run.cell} is running on {run.worker}: cancel it first")
    experiment = run.experiment
    folder = Path(run.checkpoint_dir)
    aside = folder.with_name(f"{folder.name}.replaced-run{run.pk}")
    if folder.exists():
        folder.rename(aside)
    exported = results_dir(experiment.folder) / "runs" / run.cell.replace("/", "-")
    if exported.exists():
        shutil.rmtree(exported)
    finished = run.status in (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED)
    Run.objects.filter(pk=run.pk).update(
        name=f"{run.name} (replaced)",
        experiment=None,
        cell="",
        checkpoint_dir=str(aside),
        status=run.status if finished else Run.Status.CANCELLED,
        error=run.error or f"replaced: cell {run.cell} of {experiment.name} was started again from scratch",
        finished_at=run.finished_at or timezone.now(),
    )
    run.refresh_from_db()
    return run


def cell_requeue(run: Run) -> bool:
    """Make an unfinished cell's run claimable again (failed, cancelled or lost); False if it is live."""
    if run.status == Run.Status.SUCCEEDED:
        return False
    if run.status == Run.Status.RUNNING and not run.is_lost:
        return False
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.QUEUED, cancel_requested=False, error="", finished_at=None, heartbeat_at=None
    )
    run.refresh_from_db()
    return True


def experiment_run(
    spec: ExperimentSpec,
    owner,
    *,
    here: bool = False,
    only: Iterable[str] = (),
    restart: Iterable[str] = (),
    say: Callable[[str], None] = print,
    shared: bool = True,
    launch_token: str = "",
) -> Experiment:
    """Queue (or, ``here``, train one after another in this process) every unfinished cell of ``spec``.

    ``only``: cell keys or arm names to limit the grid to. ``restart``: cell keys or arm names to start
    again from scratch (``cell_restart``). Finished cells are skipped (their result files are refreshed); a
    live cell is left to its worker; an unfinished cell whose run was started under another config than
    the file's is not resumed (restart it, or put the file back).
    """
    experiment = experiment_sync(spec, owner, shared=shared)
    wanted, again = set(only), set(restart)
    for state in experiment_cells(experiment, spec):
        cell = state.cell
        if wanted and cell.key not in wanted and cell.arm not in wanted:
            continue
        restarting = cell.key in again or cell.arm in again
        if not restarting and state.committed:
            say(f"{cell.key}: done (results committed in {state.committed}; this database has no run of it)")
            continue
        run = _cell_run_or_restart(experiment, cell, owner, restart=restarting, say=say, token=launch_token)
        if not _cell_settled(run, cell, say):
            _cell_start(run, cell, here=here, say=say)
    return experiment


def _cell_run_or_restart(
    experiment: Experiment, cell: Cell, owner, *, restart: bool, say: Callable[[str], None], token: str
) -> Run:
    """The cell's run (``cell_run``); ``restart``: a new one, once the old is set aside (``cell_restart``)."""
    run = cell_run(experiment, cell, owner, launch_token=token)
    if not restart:
        return run
    old = cell_restart(run)
    say(f"{cell.key}: run {old.pk} set aside as {old.name!r} ({old.checkpoint_dir})")
    return cell_run(experiment, cell, owner, launch_token=token)


def _cell_settled(run: Run, cell: Cell, say: Callable[[str], None]) -> bool:
    """Whether the cell's run is to be left as it is, and says why: finished (its result files refreshed), or
    unfinished under another config than the file's (resuming it would mix two configs in one result)."""
    drift = config_drift(run, cell)
    if run.status == Run.Status.SUCCEEDED:
        export_results(run)
        note = f"; started under another config than the file's: {drift}" if drift else ""
        say(f"{cell.key}: done (run {run.pk}{note})")
        return True
    if drift and not (run.status == Run.Status.RUNNING and not run.is_lost):
        say(
            f"{cell.key}: not resumed: run {run.pk} was started under another config than the file's "
            f"({drift}); pass --restart {cell.key} to start it again from scratch, or put the file back"
        )
        return True
    return False


def _cell_start(run: Run, cell: Cell, *, here: bool, say: Callable[[str], None]) -> None:
    """Queue the cell's run (``here``: train it in this process), from its last checkpoint where it has one;
    a live run is left to its worker."""
    was = run.display_status
    if not cell_requeue(run) and run.status != Run.Status.QUEUED:
        say(f"{cell.key}: {run.display_status} on {run.worker or 'a worker'} (run {run.pk})")
        return
    resumes = any(Path(run.checkpoint_dir).glob("checkpoints/step-*[0-9]"))
    how = "resuming from its last checkpoint" if resumes else "from the start"
    if here:
        say(f"{cell.key}: {was} -> training here, {how} (run {run.pk}){emulated_bf16_note(cell)}")
        status = train_cell_here(run)
        say(f"{cell.key}: {status}")
    else:
        run_enqueue_on_commit(run.pk)
        say(f"{cell.key}: {was} -> queued, {how} (run {run.pk})")


def emulated_bf16_note(cell: Cell) -> str:
    """A warning for a cell whose engines run bfloat16 on a machine that emulates it (an AVX2-only CPU):
    it trains correctly but several times slower than where the cell's results were measured (vLLM's
    bf16 GEMMs run in float32 on such a machine: as fast as float32, itself 5-6x slower than native bf16)."""
    if cell.config.rollout.dtype != "bfloat16" or native_bf16():
        return ""
    return (
        "; note: its rollout.dtype is bfloat16 and this machine has no native bf16 (no AVX512-BF16 or AMX): "
        "its GEMMs run in float32 here (bench_bf16_route: 0.9-1.1x float32's time), and a cell takes about "
        "6x as long as where bf16 is native"
    )


def train_cell_here(run: Run) -> str:
    """Train a queued cell's run on this machine, as a worker would: in supervised child processes of its
    own (``webapp.supervisor``): every cell starts from the code as it is now and gives its memory back when
    it ends, and a cell whose process dies resumes from its checkpoint (or fails alone while the grid goes
    on)."""
    status = claim_and_train(run, worker="experiment")
    run.refresh_from_db()
    return run.status if status.startswith("run ") else status


# ---- result files ---------------------------------------------------------------------------------


def export_results(run: Run) -> Path | None:
    """Copy a finished cell's small result files to ``docs/experiments/<name>/runs/<cell>/``."""
    if run.experiment_id is None or not run.checkpoint_dir:
        return None
    experiment = Experiment.objects.get(pk=run.experiment_id)
    src = Path(run.checkpoint_dir)
    dest = results_dir(experiment.folder) / "runs" / run.cell.replace("/", "-")
    dest.mkdir(parents=True, exist_ok=True)
    if (src / "config.json").exists():
        shutil.copyfile(src / "config.json", dest / "config.json")
    metrics = last_attempt(read_lines(src / "metrics.jsonl"))
    if (src / "metrics.jsonl").exists():
        write_lines(dest / "metrics.jsonl", metrics)
    if (src / "episodes.jsonl").exists():
        episodes = last_batches(read_lines(src / "episodes.jsonl"), batch_sizes(metrics))
        write_lines(dest / "episodes.jsonl", episodes)
    if (src / FAILURES_FILE).exists():  # every attempt's: what the extractor wrote that could not be used
        shutil.copyfile(src / FAILURES_FILE, dest / FAILURES_FILE)
    write_lines(dest / "changes.jsonl", bank_changes(run))
    write_lines(dest / "merges.jsonl", bank_merges(run))
    (dest / "cell.json").write_text(json.dumps(cell_record(run), indent=1))
    return dest


def cell_record(run: Run) -> dict:
    return {
        "experiment": run.experiment.name if run.experiment else "",
        "cell": run.cell,
        "run": run.pk,
        "uid": str(run.uid),
        "status": run.status,
        "method": run.method,
        "env": run.env,
        "seed": run.seed,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "environment": run.environment,
    }


def bank_changes(run: Run) -> Iterable[dict]:
    changes = ExperienceChange.objects.filter(run=run).order_by("id")
    for c in changes.iterator(chunk_size=500):
        after = c.after or {}
        yield {
            "id": c.pk,
            "entry": c.experience_id,
            "kind": c.kind,
            "actor": c.actor,
            "step": c.step,
            "merge": c.merge_id,
            "title": after.get("title", ""),
            "content": after.get("content", ""),
            "scope": after.get("scope", ""),
            "deleted": bool(after.get("deleted")),
            "generation_version": (after.get("generation") or {}).get("generation_weight_version"),
        }


def bank_merges(run: Run) -> Iterable[dict]:
    for m in Merge.objects.filter(run=run).order_by("id").iterator(chunk_size=200):
        yield {
            "id": m.pk,
            "scope": m.scope,
            "step": m.step,
            "chunk": m.chunk,
            "decision": m.decision,
            "inputs": [i.get("id") for i in m.inputs if isinstance(i, dict)],
            "outputs": list(m.outputs),
            "actions": m.actions,
        }

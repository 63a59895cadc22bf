"""Writes on runs: launch (runs or an experiment's grid, from a checked config), create (N seeds), cancel,
resume. Views and tasks call these; they hold the rules and raise ValidationError or RunError for a person."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.utils import timezone

from trainer.config import RunConfig
from trainer.experiments.spec import ExperimentSpec
from trainer.plan import PlanError
from webapp.celery import app
from webapp.events import broadcast_run_event
from webapp.experiments import experiment_name_taken, experiment_run
from webapp.models import Experiment, Run
from webapp.queueing import run_enqueue_on_commit
from webapp.selectors import run_get
from webapp.workers import Placement, place, place_all

LAUNCH_PERMISSION = "webapp.launch_run"
"""Who may launch, clone and resume runs (Django's model permission until a dedicated one exists)."""


class RunError(Exception):
    """An action on a run that cannot be done now; the message says why, for a person."""


EDIT_BANK_PERMISSION = "experience.edit_bank"
"""Who may edit, pin, delete, prune and import experiences (on runs they manage)."""


def can_edit_bank(user, run: Run) -> bool:
    return user.has_perm(EDIT_BANK_PERMISSION) and can_manage(user, run)


def can_launch(user) -> bool:
    return user.has_perm(LAUNCH_PERMISSION)


def can_manage(user, run: Run) -> bool:
    """Cancel and resume: the owner or staff."""
    return user.is_staff or run.owner_id == user.id


def run_get_managed(user, run_id: int) -> Run:
    """The run if this user may see it (else 404) and manage it (else 403): cancel, resume."""
    run = run_get(user, run_id)
    if not can_manage(user, run):
        raise PermissionDenied("only the run's owner may do this")
    return run


def run_create(
    owner,
    config: RunConfig,
    *,
    name: str = "",
    tags: list[str] | None = None,
    shared: bool = False,
    n_seeds: int = 1,
    resume_from: str = "",
    launch_token: str = "",
) -> list[Run]:
    """Queue ``n_seeds`` runs of ``config`` (seeds seed, seed+1, ...); each goes to a worker on commit.

    ``launch_token``: the form submission; the same submission twice (a double click, a retried POST) gets
    the runs of the first instead of new ones."""
    if n_seeds < 1:
        raise RunError("launch at least one seed")
    base = name or f"{config.method} on {config.env}"
    runs = []
    with transaction.atomic():
        if launch_token:
            if earlier := launched_by(launch_token):
                return earlier
        for i in range(n_seeds):
            cfg = config.with_overrides(seed=config.seed + i)
            run = Run.objects.create(
                name=f"{base} · seed {cfg.seed}" if n_seeds > 1 else base,
                owner=owner,
                shared=shared,
                tags=list(tags or []),
                method=cfg.method,
                env=cfg.env,
                seed=cfg.seed,
                config=cfg.to_dict(),
                resume_from=resume_from,
                launch_token=launch_token,
            )
            run_enqueue_on_commit(run.id)
            runs.append(run)
    return runs


@dataclass
class Launched:
    """What a launch queued: runs, maybe an experiment's cells; ``again`` when an earlier copy of the same
    submission had queued them already; ``placement``: where they went and their plan (None: launched
    unchecked, or launched before)."""

    runs: list[Run]
    again: bool = False
    placement: Placement | None = None

    @property
    def experiment(self) -> Experiment | None:
        return self.runs[0].experiment


def launch_placement(config: RunConfig, spec: ExperimentSpec | None = None) -> Placement:
    """Where a launch goes and its plan on the workers' devices (``webapp.workers.place``); an experiment's
    is its first refused method's, else its first. PlanError for a model whose shape the plan cannot read."""
    methods = list(spec.methods) if spec is not None else [config.method]
    return place_all([config.with_overrides(method=m) for m in methods])


def run_launch(
    *,
    user,
    config: RunConfig,
    spec: ExperimentSpec | None = None,
    name: str = "",
    tags: list[str] | None = None,
    shared: bool = False,
    n_seeds: int = 1,
    launch_token: str = "",
) -> Launched:
    """Queue a checked launch (the page's and the API's alike): ``n_seeds`` runs of ``config``, or the grid
    of ``spec``. ValidationError when no worker can run it (the plan's refusal) or ``user`` has an experiment
    of that name (on the ``experiment`` field). A model the plan cannot read is launched unchecked. The same
    ``launch_token`` again (a double click, a retried request) leads to what the first launched."""
    with transaction.atomic():
        if earlier := run_launched_again(launch_token):
            return earlier
        placement = _launch_placement_or_refusal(config, spec)
        if spec is None:
            runs = run_create(
                user, config, name=name, tags=tags, shared=shared, n_seeds=n_seeds, launch_token=launch_token
            )
            return Launched(runs, placement=placement)
        if experiment_name_taken(user, spec.name):
            message = f"you have an experiment called {spec.name!r} already; choose another name"
            raise ValidationError({"experiment": message})
        experiment = experiment_run(spec, user, shared=shared, launch_token=launch_token)
        return Launched(list(experiment.runs.all()), placement=placement)


def _launch_placement_or_refusal(config: RunConfig, spec: ExperimentSpec | None) -> Placement | None:
    """The launch's placement; ValidationError with the plan's numbers and a fix when no worker can run it;
    None (unchecked, as before plans) for a model whose shape the plan cannot read."""
    try:
        placement = launch_placement(config, spec)
    except PlanError:
        return None
    if placement.refusal:
        raise ValidationError(placement.refusal)
    return placement


def run_launched_again(launch_token: str) -> Launched | None:
    """What an earlier copy of this launch submission queued (None: nothing, or no token)."""
    if not launch_token:
        return None
    with transaction.atomic():
        earlier = launched_by(launch_token)
    return Launched(earlier, again=True) if earlier else None


def launched_by(launch_token: str) -> list[Run]:
    """The runs an earlier copy of this form submission created; call inside a transaction. Holds a lock
    on the token until it ends, so two copies arriving together are serialised."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"launch:{launch_token}"])
    return list(Run.objects.filter(launch_token=launch_token).order_by("seed"))


def run_cancel(run: Run) -> Run:
    """Stop a run: a queued one is cancelled at once; a running one is asked to stop and does within seconds
    (its training process polls the request, ``webapp.progress.Heartbeat``); a lost one (no process trains
    it) is closed now since nobody else will."""
    if run.status not in (Run.Status.QUEUED, Run.Status.RUNNING):
        raise RunError(f"this run has already {run.status}")
    now = timezone.now()
    with transaction.atomic():
        queued = Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED).update(
            status=Run.Status.CANCELLED, cancel_requested=True, finished_at=now
        )
        if not queued:
            Run.objects.filter(pk=run.pk).update(cancel_requested=True)
            if run.is_lost:
                Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(
                    status=Run.Status.CANCELLED, finished_at=now, error="cancelled after its worker was lost"
                )
    if run.celery_task_id and queued:
        app.control.revoke(run.celery_task_id)
    run.refresh_from_db()
    transaction.on_commit(
        lambda: broadcast_run_event(run.id, {"kind": "status", "status": run.display_status})
    )
    return run


def run_resume(run: Run, owner) -> Run:
    """A new run that continues ``run`` from its last checkpoint with the same config."""
    if run.status in (Run.Status.QUEUED, Run.Status.RUNNING):
        raise RunError("this run is still active; cancel it before resuming")
    if run.finished_all_steps:
        raise RunError("this run finished all its steps; clone it (with more steps) to train further")
    source = run.checkpoint_source
    if not source:
        raise RunError(
            "this run saved no checkpoint to resume from (it stopped before its first one); clone it to "
            "start again"
        )
    config = RunConfig.from_dict(run.config)
    try:
        refused = place(config).refusal
    except PlanError:  # a model the plan cannot read: resumed unchecked, as it was launched
        refused = None
    if refused:
        raise RunError(f"it cannot be resumed: {refused}")
    (resumed,) = run_create(
        owner, config, name=f"{run.name} (resumed)", tags=run.tags, shared=run.shared,
        resume_from=source,
    )  # fmt: skip
    return resumed


def run_clone_initial(run: Run) -> dict[str, Any]:
    """The launch form's initial values for "clone this run": its full config, name and tags."""
    return {
        "base": run.config,
        "name": f"{run.name} (clone)",
        "tags": ", ".join(run.tags),
        "shared": run.shared,
    }

"""Writes on runs: create (N seeds), cancel, resume. Views and tasks call these; they hold the rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from trainer.config import ConfigError, RunConfig
from trainer.plan import PlanError
from webapp.events import broadcast_run_event
from webapp.models import Experiment, Run
from webapp.selectors import run_get
from webapp.workers import check, place, registered

if TYPE_CHECKING:
    from webapp.forms import LaunchForm

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


TRAIN_TASK = "webapp.tasks.train_run"


def _send(run_id: int, queue: str | None) -> None:
    """Send the run to ``queue`` by task name (None: the ``training`` queue settings route it to), so the web
    process never imports the training code."""
    from webapp.celery import app

    result = app.send_task(TRAIN_TASK, args=[run_id], queue=queue)
    Run.objects.filter(pk=run_id).update(celery_task_id=result.id)


def run_enqueue(run_id: int) -> None:
    """Send the run to a worker that can train it (``webapp.workers.place``). One that no live worker can
    train any more (the one that could left between the launch and now) fails with the plan's reason; a
    config that cannot be read goes to the training queue, whose worker reports why it cannot train it."""
    run = Run.objects.get(pk=run_id)
    try:
        placement = place(RunConfig.from_dict(run.config))
    except ConfigError:
        return _send(run_id, None)
    if placement.queue is None:
        run.mark_failed(f"Refused when it was queued: {placement.refusal}")
        broadcast_run_event(run_id, {"kind": "status", "status": run.display_status})
        return None
    return _send(run_id, placement.queue)


_enqueue = run_enqueue
"""What a commit calls for each new run (tests replace it to queue nothing)."""


def run_hand_on(run: Run, node: str) -> str | None:
    """Called by the worker ``node`` before it claims ``run``: None when it can train it (or is not
    registered); otherwise the run goes to a worker that can (what it says is returned), or fails with the
    plan's reason when none can, so a worker never trains a run its devices do not fit."""
    me = registered(node)
    if me is None:
        return None
    try:
        cfg = RunConfig.from_dict(run.config)
        mine = check(cfg, me)
    except ConfigError:
        return None  # an unreadable config or one with no plan: the training reports why
    if mine.fits:
        return None
    try:
        placement = place(cfg, exclude=node, queue=me.shared_queue)
    except ConfigError:  # no other worker (PlanError)
        placement = None
    if placement is not None and placement.queue is not None:
        _send(run.pk, placement.queue)
        return f"handed on to {placement.queue}"
    why = placement.refusal if placement is not None else f"no worker can run it: {mine.why_not}"
    Run.objects.filter(pk=run.pk, status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).update(
        status=Run.Status.FAILED, error=f"Refused by {node}: {why}", finished_at=timezone.now()
    )
    return Run.Status.FAILED


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
            transaction.on_commit(lambda run_id=run.id: _enqueue(run_id))
            runs.append(run)
    return runs


@dataclass
class Launched:
    """What a launch submission queued: runs, maybe an experiment's cells; ``again`` when an earlier copy
    of the same submission had queued them already."""

    runs: list[Run]
    again: bool = False

    @property
    def experiment(self) -> Experiment | None:
        return self.runs[0].experiment


def run_launch_submission(user, form: LaunchForm) -> Launched | None:
    """Queue what a launch form asks for (the page's and the API's alike): runs, or an experiment's grid.
    None if the form is invalid (its errors say why). The same submission token posted again (a double click,
    a retried request) leads to what the first one launched, never to a copy."""
    token = submission_token(form)
    with transaction.atomic():
        if token and (earlier := launched_by(token)):
            return Launched(earlier, again=True)
        if not form.is_valid():
            return None
        data = form.cleaned_data
        if form.spec is not None:
            from webapp.experiments import experiment_name_taken, experiment_run

            if experiment_name_taken(user, form.spec.name):
                message = f"you have an experiment called {form.spec.name!r} already; choose another name"
                form.add_error("experiment", message)
                return None
            token = data["submission"]
            experiment = experiment_run(form.spec, user, shared=data["shared"], launch_token=token)
            return Launched(list(experiment.runs.all()))
        runs = run_create(
            user, form.config, name=data["name"], tags=data["tags"], shared=data["shared"],
            n_seeds=data["n_seeds"], launch_token=data["submission"],
        )  # fmt: skip
    return Launched(runs)


def submission_token(form: LaunchForm) -> str:
    """The form's submission token if the form's own field accepts it, else "" (a malformed one is the
    form's error to name, never a database lookup)."""
    try:
        return form.fields["submission"].clean(form.data.get("submission", ""))
    except ValidationError:
        return ""


def launched_by(launch_token: str) -> list[Run]:
    """The runs an earlier copy of this form submission created; call inside a transaction. Holds a lock
    on the token until it ends, so two copies arriving together are serialised."""
    from django.db import connection

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
        from webapp.celery import app

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

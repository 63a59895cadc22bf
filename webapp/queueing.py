"""Sending runs to the workers that can train them: on a launch's commit, and when a worker finds that its
devices do not fit a run it was given (``webapp.workers`` places a run by its plan on the workers' devices).

Launches (``webapp.services``) and experiments (``webapp.experiments``) both queue through here, so neither
needs the other to send a run."""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from trainer.config import ConfigError, RunConfig
from webapp.celery import app
from webapp.events import broadcast_run_event
from webapp.models import Run
from webapp.workers import check, place, registered, wait_reason

TRAIN_TASK = "webapp.tasks.train_run"
WAITING = "Waiting for memory"
"""How the notice of a run that waits for its worker's memory begins (``webapp.workers.wait_reason``)."""


def run_send(run_id: int, queue: str | None) -> None:
    """Send the run to ``queue`` by task name (None: the ``training`` queue settings route it to), so the web
    process never imports the training code."""
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
        return run_send(run_id, None)
    if placement.queue is None:
        run.mark_failed(f"Refused when it was queued: {placement.refusal}")
        broadcast_run_event(run_id, {"kind": "status", "status": run.display_status})
        return None
    return run_send(run_id, placement.queue)


_enqueue = run_enqueue
"""What a commit calls for each new run (tests replace it to queue nothing)."""


def run_enqueue_on_commit(run_id: int) -> None:
    """Queue the run once the current transaction commits: a worker must find it in the database."""
    transaction.on_commit(lambda: _enqueue(run_id))


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
        run_send(run.pk, placement.queue)
        return f"handed on to {placement.queue}"
    why = placement.refusal if placement is not None else f"no worker can run it: {mine.why_not}"
    Run.objects.filter(pk=run.pk, status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).update(
        status=Run.Status.FAILED, error=f"Refused by {node}: {why}", finished_at=timezone.now()
    )
    return Run.Status.FAILED


def run_admission(run: Run, node: str) -> str | None:
    """Called by the worker ``node`` in the transaction that claims ``run``: why it must wait (its planned
    peak does not fit beside the runs ``node`` trains; the run's notice says so), else None. Holds a lock
    per node until the transaction ends, so two slots of one worker never both admit against the same
    free memory."""
    me = registered(node)
    if me is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"admission:{node}"])
    others = Run.objects.filter(status=Run.Status.RUNNING, worker__startswith=f"{node}:").exclude(pk=run.pk)
    try:
        training = [(o.pk, RunConfig.from_dict(o.config)) for o in others if not o.is_lost]
        why = wait_reason(RunConfig.from_dict(run.config), me, training)
    except ConfigError:
        return None  # an unreadable config: the training reports why
    if why is not None:
        Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED).update(notice=why)
    else:
        Run.objects.filter(pk=run.pk, notice__startswith=WAITING).update(notice="")
    return why

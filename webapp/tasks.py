"""Celery tasks: thin, idempotent, passed ids not instances."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback

from celery import shared_task
from celery.signals import worker_ready
from django.db import connection
from django.db.models import F

from trainer.config import ConfigError
from trainer.models import ModelNotFound
from webapp.events import broadcast_run_event
from webapp.models import Run
from webapp.queueing import run_admission, run_enqueue, run_hand_on
from webapp.supervisor import MAX_RESTARTS, RunWaits, claim_and_train

log = logging.getLogger(__name__)


@shared_task
def broadcast_run_event_task(run_id: int, event: dict) -> str:
    """Push an event to a run's watchers from a worker (used by health checks and tests)."""
    broadcast_run_event(run_id, event)
    return "sent"


@shared_task
def ping(payload: str = "pong") -> dict:
    """A worker round-trip: the result is stored in PostgreSQL and read back by the caller."""
    return {"payload": payload, "worker_pid": os.getpid(), "host": socket.gethostname()}


ADMISSION_RETRY_S = 30
"""How often a run that waits for memory on its worker asks again."""


@shared_task(bind=True, name="webapp.tasks.train_run", acks_late=True, reject_on_worker_lost=True)
def train_run(self, run_id: int) -> str:
    """Train one run on this worker. Safe to deliver twice: only one worker can claim the run.

    A run whose worker died (heartbeat stale, or its claiming process gone) is claimed again when its task
    is redelivered or requeued (``requeue_lost_runs``), and resumes from its last checkpoint. A run this
    worker's devices do not fit is handed on to one whose do (``webapp.queueing.run_hand_on``); one whose
    planned peak does not fit beside the runs this worker trains waits, its notice saying why
    (``webapp.queueing.run_admission``).
    """
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return f"run {run_id} does not exist"
    node = self.request.hostname or socket.gethostname()
    if (handed := run_hand_on(run, node)) is not None:  # its devices do not fit this run
        if handed == Run.Status.FAILED:
            broadcast_run_event(run_id, {"kind": "status", "status": handed})
        return handed
    try:
        status = claim_and_train(run, worker=node, admit=lambda: run_admission(run, node))
    except RunWaits as waiting:  # this worker's memory is taken by the runs it trains
        broadcast_run_event(run_id, {"kind": "status", "status": run.display_status, "notice": str(waiting)})
        raise self.retry(countdown=ADMISSION_RETRY_S, max_retries=None) from None
    if status in Run.Status.values:  # it was claimed here and has ended
        broadcast_run_event(run_id, {"kind": "status", "status": status})
    return status


LOST_SWEEP_S = 60
"""How often a worker of the training queue looks for runs no process is training."""


def requeue_lost_runs() -> list[int]:
    """Put runs no process is training (``Run.is_lost``: their worker died with them) back on the training
    queue, to resume from their last checkpoint on any worker, or fail those resumed ``MAX_RESTARTS``
    times already; returns the requeued ids. The conditional update makes it safe on several workers."""
    requeued = []
    for run in Run.objects.filter(status=Run.Status.RUNNING):
        if not run.is_lost:
            continue
        if run.restarts >= MAX_RESTARTS:
            run.mark_failed(
                f"No process was training it and it was resumed {run.restarts} times already; resume it "
                "by hand once the cause is found (the worker's log has it)."
            )
            continue
        notice = (
            f"No process was training it (its worker stopped at step {run.step}); put back on the queue to "
            f"resume from its last checkpoint (restart {run.restarts + 1} of {MAX_RESTARTS})."
        )
        same = Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING, heartbeat_at=run.heartbeat_at)
        if same.update(status=Run.Status.QUEUED, restarts=F("restarts") + 1, notice=notice):
            run_enqueue(run.pk)  # to a worker whose devices fit it
            requeued.append(run.pk)
    return requeued


def _sweep_lost_runs_forever() -> None:
    while True:
        time.sleep(LOST_SWEEP_S)
        try:
            requeue_lost_runs()
        except Exception:  # noqa: BLE001 - the next sweep tries again
            log.warning("the sweep for lost runs failed", exc_info=True)
        finally:
            connection.close()


@worker_ready.connect
def start_lost_run_sweep(sender, **kwargs) -> None:
    """Workers of the product's training queue resume lost runs by themselves (test workers, which
    consume queues of their own, do not touch other runs)."""
    if "training" in sender.app.amqp.queues.consume_from:
        threading.Thread(target=_sweep_lost_runs_forever, name="lost-run-sweep", daemon=True).start()


def failure_message(exc: BaseException) -> str:
    """What a person sees on the run page: what went wrong, what to do, then the traceback."""
    name = type(exc).__name__
    if isinstance(exc, ConfigError):
        head = f"Invalid configuration: {exc}. Fix it and launch again (or clone this run)."
    elif isinstance(exc, ModelNotFound):
        head = f"Model not found: {exc}"
    elif isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        head = (
            f"Out of memory ({name}: {exc}). Lower tasks_per_step, k_rollouts, rollout.context_tokens "
            "or rollout.kv_cache_gib, or use a worker with more memory."
        )
    else:
        head = f"{name}: {exc}"
    tail = "".join(traceback.format_exception(exc)[-6:])
    return f"{head}\n\n{tail}"

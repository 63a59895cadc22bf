"""Celery tasks: thin, idempotent, passed ids not instances."""

from __future__ import annotations

import logging
import os
import socket
import traceback

from celery import shared_task

from webapp.events import broadcast_run_event
from webapp.models import Run

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


@shared_task(bind=True, name="webapp.tasks.train_run", acks_late=True, reject_on_worker_lost=True)
def train_run(self, run_id: int) -> str:
    """Train one run on this worker. Safe to deliver twice: only one worker can claim the run.

    A run whose worker died (heartbeat stale) is claimed again when its task is redelivered, and
    resumes from its last checkpoint.
    """
    from webapp.training import run_training  # the trainer (torch, vLLM) loads only on workers

    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return f"run {run_id} does not exist"
    if not run.claim(worker=self.request.hostname or socket.gethostname()):
        return f"run {run_id} not claimed: {run.status}"
    try:
        status = run_training(run)
    except Exception as exc:  # noqa: BLE001 - every failure ends as a readable message on the run
        log.exception("run %s failed", run_id)
        run.mark_failed(failure_message(exc))
        status = Run.Status.FAILED
    broadcast_run_event(run_id, {"kind": "status", "status": status})
    return status


def failure_message(exc: BaseException) -> str:
    """What a person sees on the run page: what went wrong, what to do, then the traceback."""
    from trainer.config import ConfigError
    from trainer.models import ModelNotFound

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

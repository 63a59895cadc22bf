"""Celery tasks: thin, idempotent, passed ids not instances."""

from __future__ import annotations

import os
import socket
import traceback

from celery import shared_task

from webapp.events import broadcast_run_event
from webapp.models import Run


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
    from webapp.training import claim_and_train  # the trainer (torch, vLLM) loads only on workers

    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return f"run {run_id} does not exist"
    status = claim_and_train(run, worker=self.request.hostname or socket.gethostname())
    if status in Run.Status.values:  # it was claimed here and has ended
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

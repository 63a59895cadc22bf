"""Celery tasks: thin, idempotent, passed ids not instances."""

from __future__ import annotations

from celery import shared_task

from webapp.events import broadcast_run_event


@shared_task
def broadcast_run_event_task(run_id: int, event: dict) -> str:
    """Push an event to a run's watchers from a worker (used by health checks and tests)."""
    broadcast_run_event(run_id, event)
    return "sent"


@shared_task
def ping(payload: str = "pong") -> dict:
    """A worker round-trip: the result is stored in PostgreSQL and read back by the caller."""
    import os
    import socket

    return {"payload": payload, "worker_pid": os.getpid(), "host": socket.gethostname()}

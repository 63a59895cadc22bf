"""Celery tasks of the experience bank (``default`` queue): thin, passed ids, safe to run twice."""

from __future__ import annotations

from celery import shared_task

from experience.services import IMPORT_TASK, import_job_run


@shared_task(name=IMPORT_TASK, acks_late=True, reject_on_worker_lost=True)
def import_bank(job_id: int) -> str:
    """Import one uploaded JSONL export (``ImportJob``) into its run's bank; returns the job's status."""
    return import_job_run(job_id)

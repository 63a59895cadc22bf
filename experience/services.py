"""Writes to an experience bank from people and commands (the dashboard, ``manage.py``).

Each goes through ``experience.bank`` (atomic, recorded with the person who did it) under the run's
writer lock when a manager serves that run in this process (``write_access``), so a person's edit never
interleaves with the extractor's operations or a merge.
"""

from __future__ import annotations

import logging
import os
import uuid
from datetime import timedelta
from pathlib import Path
from typing import IO

from celery import current_app
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from experience import bank, transfer
from experience.embedding import Embedder, LowPriorityEmbedder, default_embedder
from experience.manager import live_manager, write_access
from experience.models import Experience, ExperienceChange, ImportJob, Merge

Actor = ExperienceChange.Actor
logger = logging.getLogger(__name__)


def _embedder(run_id: int | None) -> Embedder:
    manager = live_manager(run_id)
    return manager.embedder if manager else default_embedder()


def experience_add(run, scope: str, title: str, content: str, *, user=None, step: int = 0) -> Experience:
    embedder = _embedder(run.pk)
    vector = embedder.embed_one(bank.entry_text(title, content))
    with write_access(run.pk) as manager:
        capacity = manager.capacity if manager else None
        return bank.add(
            run.pk, scope, title, content, vector, embedding_model=embedder.model_id, step=step,
            actor=Actor.PERSON, user=user, capacity=capacity,
        )  # fmt: skip


def experience_edit(
    entry: Experience, title: str, content: str, *, expected_version: int, user=None
) -> Experience:
    """A person's edit, recorded at the run's current step. ``expected_version``: the version the person
    edited (always given: an edit that does not say what it started from could overwrite newer text); if
    the entry changed since, ``bank.EntryChanged`` and nothing is saved (no lost update)."""
    embedder = _embedder(entry.run_id)
    vector = embedder.embed_one(bank.entry_text(title, content))
    step = entry.run.step if entry.run_id else entry.updated_step
    with write_access(entry.run_id):
        return bank.update(
            entry.pk, title, content, vector, embedding_model=embedder.model_id, step=step,
            actor=Actor.PERSON, user=user, expected_version=expected_version,
        )  # fmt: skip


def experience_pin(
    entry: Experience, pinned: bool = True, *, user=None, expected_version: int | None = None
) -> Experience:
    """Pin or unpin; ``expected_version`` (when the page sent it): refused if the entry changed since."""
    with write_access(entry.run_id):
        return bank.set_pinned(entry.pk, pinned, user=user, expected_version=expected_version)


def experience_delete(entry: Experience, *, user=None, expected_version: int | None = None) -> Experience:
    """Delete (undoable), recorded at the run's current step; ``expected_version`` (when the page sent it):
    refused if the entry changed since, so a person never deletes text they have not seen."""
    step = entry.run.step if entry.run_id else entry.updated_step
    with write_access(entry.run_id):
        return bank.delete(
            entry.pk, actor=Actor.PERSON, user=user, expected_version=expected_version, step=step
        )


def experience_prune(run, ids: list[int], *, user=None) -> tuple[int, str]:
    """Delete exactly the entries ``ids`` (the preview a person confirmed) that are still live and unpinned
    in this run's bank, as one action; returns how many and the action's id for ``prune_undo``."""
    batch = uuid.uuid4().hex
    with write_access(run.pk), transaction.atomic():
        live = Experience.objects.in_bank(run.pk).filter(pk__in=ids, pinned=False)
        deleted = list(live.values_list("id", flat=True))
        for entry_id in deleted:
            bank.delete(entry_id, run_id=run.pk, actor=Actor.PERSON, user=user, step=run.step, batch=batch)
    return len(deleted), batch


def prune_undo(run, batch: str, *, user=None) -> int:
    """Bring back every entry one prune deleted (all or nothing); returns how many."""
    with write_access(run.pk):
        return len(bank.undo_batch(run.pk, batch, _embedder(run.pk), user=user))


def experience_undo(change: ExperienceChange, *, user=None) -> ExperienceChange:
    """Revert one change (of a merge: the whole merge); the entry must not have changed since."""
    with write_access(change.run_id):
        if change.merge_id is not None:
            return bank.undo_merge(change.merge_id, _embedder(change.run_id), user=user)[-1]
        return bank.undo_change(change.pk, _embedder(change.run_id), user=user)


def merge_undo(merge: Merge, *, user=None) -> list[ExperienceChange]:
    with write_access(merge.run_id):
        return bank.undo_merge(merge.pk, _embedder(merge.run_id), user=user)


def experience_export(run, out: IO[str], *, scope: str | None = None) -> int:
    return transfer.export_jsonl(run.pk, out, scope=scope)


def experience_import(run, source: IO, *, user=None, file_name: str = "", size: int | None = None) -> int:
    """Import a JSONL export (a seekable text or binary file) here and now; returns how many entries. The
    job's ``size`` (bytes) is ``size`` or else measured from the file, so its line never says 0 bytes."""
    size = _file_size(source) if size is None else size
    job = ImportJob.objects.create(run=run, user=user, file_name=file_name[:255], size=size)
    return _run_import(job, source)


def _file_size(source: IO) -> int:
    """The length of a seekable file, leaving its position where it was (0 where it cannot seek)."""
    try:
        here = source.tell()
        end = source.seek(0, os.SEEK_END)
        source.seek(here)
    except (AttributeError, OSError, ValueError):
        return 0
    return end


def _run_import(job: ImportJob, source: IO, embedder: Embedder | None = None) -> int:
    manager = live_manager(job.run_id)
    return transfer.run_job(
        job, source, embedder or _embedder(job.run_id), capacity=manager.capacity if manager else None,
        writing=lambda: write_access(job.run_id),
    )  # fmt: skip


IMPORT_TASK = "experience.tasks.import_bank"
"""The task that runs an import job (``experience.tasks``), sent by name: the task calls this module."""
IMPORT_STALE = timedelta(minutes=10)
"""An import job whose worker has not reported for this long is taken over by a redelivered task."""


IMPORT_INLINE_MAX_BYTES = 256 * 1024
"""Larger uploads are imported by a worker (``default`` queue), with progress on the bank page."""


def import_upload(run, upload: UploadedFile, *, user=None) -> ImportJob:
    """The import of an uploaded JSONL export, as the bank page and the API start it: a small file here and
    now (all or nothing: a refused file's job has failed, its ``error`` saying why), a larger one queued for
    a worker (``import_job_start``)."""
    if upload.size > IMPORT_INLINE_MAX_BYTES:
        return import_job_start(run, upload, user=user)
    job = ImportJob.objects.create(run=run, user=user, file_name=(upload.name or "")[:255], size=upload.size)
    try:
        _run_import(job, upload)
    except ValueError:
        pass  # run_job marked the job failed, with what was wrong
    job.refresh_from_db()
    return job


def import_job_start(run, upload: UploadedFile, *, user=None) -> ImportJob:
    """Keep an uploaded export for a worker (``var/imports``) and queue its import (after commit)."""
    folder = Path(settings.VAR_DIR) / "imports"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{uuid.uuid4().hex}.jsonl"
    with path.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    job = ImportJob.objects.create(
        run=run, user=user, file_name=(upload.name or "")[:255], path=str(path), size=upload.size
    )
    transaction.on_commit(lambda: current_app.send_task(IMPORT_TASK, args=[job.pk]))
    return job


def import_job_run(job_id: int) -> str:
    """The task's work: claim the job (a queued one, or one whose worker went silent), import its file,
    remove the file. Returns the job's final status."""
    silent = Q(updated_at__lt=timezone.now() - IMPORT_STALE) & ~Q(status__in=ImportJob.ENDED)
    claimed = ImportJob.objects.filter(Q(status=ImportJob.Status.QUEUED) | silent, pk=job_id)
    if not claimed.update(status=ImportJob.Status.VALIDATING, done=0, updated_at=timezone.now()):
        return "not claimed"
    job = ImportJob.objects.select_related("user").get(pk=job_id)
    job.rows.all().delete()  # staged by a worker that died
    path = Path(job.path)
    try:
        with (
            path.open("rb") as source,
            LowPriorityEmbedder(
                _embedder(job.run_id),
                settings.STUDIO_IMPORT_NICE,
                idle=settings.STUDIO_IMPORT_IDLE,
                share=settings.STUDIO_IMPORT_SHARE,
                heartbeat=lambda: _still_importing(job),
                every_s=settings.STUDIO_IMPORT_HEARTBEAT_S,
                giving_way=lambda now: _giving_way(job, now),
            ) as e,
        ):
            _run_import(job, source, e)
    except OSError as err:
        job.mark_failed(f"the uploaded file could not be read ({err}); upload it again")
    except Exception:  # noqa: BLE001 - run_job has marked the job failed with the message
        logger.info("import job %s failed", job_id, exc_info=True)
    finally:
        path.unlink(missing_ok=True)
        ImportJob.objects.filter(pk=job_id).update(path="")
    return ImportJob.objects.get(pk=job_id).status


def _still_importing(job: ImportJob) -> None:
    """While a batch waits for a core: the job is alive (so no redelivered task takes it over as silent), and
    a cancel asked for meanwhile ends it now."""
    ImportJob.objects.filter(pk=job.pk).update(updated_at=timezone.now())
    transfer.stop_if_cancelled(job)


def _giving_way(job: ImportJob, now: bool) -> None:
    """The bank page says when an import embeds slowly, or waits, because training keeps the cores busy."""
    ImportJob.objects.filter(pk=job.pk).update(giving_way_since=timezone.now() if now else None)


def import_job_cancel(job: ImportJob) -> str:
    """Ask an import to stop, importing nothing: a queued one ends now (its file removed); one being
    validated or embedded stops at its next progress report (within a batch of lines, or within
    ``STUDIO_IMPORT_HEARTBEAT_S`` while a batch waits for a core). ``BankError`` when it
    has ended or is already writing its entries (a single transaction of seconds). Returns what happened."""
    queued = ImportJob.objects.filter(pk=job.pk, status=ImportJob.Status.QUEUED)
    if queued.update(status=ImportJob.Status.CANCELLED, finished_at=timezone.now()):
        if job.path:
            Path(job.path).unlink(missing_ok=True)
        return "cancelled"
    job.refresh_from_db()
    if job.finished:
        raise bank.BankError(f"the import has {job.status} already")
    if job.status == ImportJob.Status.WRITING:
        raise bank.BankError("the import is writing its entries already (one transaction, seconds): too late")
    ImportJob.objects.filter(pk=job.pk).exclude(status__in=ImportJob.ENDED).update(cancel_requested=True)
    return "stopping"

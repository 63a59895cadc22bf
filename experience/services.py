"""Writes to an experience bank from people and commands (the dashboard, ``manage.py``).

Each goes through ``experience.bank`` (atomic, recorded with the person who did it) under the run's
writer lock when a manager serves that run in this process (``write_access``), so a person's edit never
interleaves with the extractor's operations or a merge.
"""

from __future__ import annotations

import uuid
from typing import IO

from django.db import transaction

from experience import bank, transfer
from experience.embedding import Embedder, default_embedder
from experience.manager import live_manager, write_access
from experience.models import Experience, ExperienceChange, Merge

Actor = ExperienceChange.Actor


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
    entry: Experience, title: str, content: str, *, user=None, expected_version: int | None = None
) -> Experience:
    """A person's edit, recorded at the run's current step. ``expected_version``: the version the person
    edited; if the entry changed since, ``BankError`` and nothing is saved (no lost update)."""
    embedder = _embedder(entry.run_id)
    vector = embedder.embed_one(bank.entry_text(title, content))
    step = entry.run.step if entry.run_id else entry.updated_step
    with write_access(entry.run_id):
        return bank.update(
            entry.pk, title, content, vector, embedding_model=embedder.model_id, step=step,
            actor=Actor.PERSON, user=user, expected_version=expected_version,
        )  # fmt: skip


def experience_pin(entry: Experience, pinned: bool = True, *, user=None) -> Experience:
    with write_access(entry.run_id):
        return bank.set_pinned(entry.pk, pinned, user=user)


def experience_delete(entry: Experience, *, user=None) -> Experience:
    with write_access(entry.run_id):
        return bank.delete(entry.pk, actor=Actor.PERSON, user=user)


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


def experience_import(run, lines: IO[str], *, user=None) -> int:
    with write_access(run.pk) as manager:
        capacity = manager.capacity if manager else None
        return transfer.import_jsonl(run.pk, lines, _embedder(run.pk), user=user, capacity=capacity)

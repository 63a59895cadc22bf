"""Writes to the bank, each one atomic and recorded as an ``ExperienceChange`` that can be undone.

These functions are the single write path. Callers hold the run's writer lock (the live manager's, see
``experience.manager.write_access``); inside, every write also takes a PostgreSQL advisory lock per run (an
import only at its end), so writers in other processes (the web app while a Celery worker trains) are
serialised too. Usage and training counters are never written here: they change only through F()
expressions, so a write never overwrites a concurrent counter update (rows are locked and saved with
``update_fields``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from django.db import connection, transaction
from django.utils import timezone

from experience.embedding import Embedder
from experience.models import Experience, ExperienceChange, Merge
from trainer.store import Entry, Generation, MergeAction, MergePlan

Kind = ExperienceChange.Kind
Actor = ExperienceChange.Actor
_ADVISORY_NAMESPACE = 7351  # first key of pg_advisory_xact_lock(int, int); the second is the run id

TEXT_FIELDS = ["title", "content", "scope", "embedding", "embedding_model", "pinned", "deleted_at", "version"]
GENERATION_FIELDS = [
    "generation_prompt",
    "generation_response",
    "generation_token_ids",
    "generation_logprobs",
    "generation_weight_version",
]


class BankError(ValueError):
    """A write that cannot be done as asked (unknown or deleted entry, stale undo...)."""


class EntryDeleted(BankError):
    """The entry was deleted: it takes no edit or pin until its deletion is undone."""


class EntryChanged(BankError):
    """The entry changed since the version the writer started from (``version`` is its version now)."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


def _check_version(e: Experience, expected_version: int | None) -> None:
    if expected_version is not None and e.version != expected_version:
        raise EntryChanged(
            f"experience #{e.pk} changed since version {expected_version} (it is at version {e.version})",
            e.version,
        )


def entry_text(title: str, content: str) -> str:
    """What gets embedded for an entry."""
    return f"{title}\n{content}"


def lock_bank(run_id: int | None) -> None:
    """Serialise writers of one run across processes until the end of the current transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_ADVISORY_NAMESPACE, run_id or 0])


def to_entry(e: Experience, similarity: float | None = None, score: float | None = None) -> Entry:
    return Entry(
        id=e.pk,
        scope=e.scope,
        title=e.title,
        content=e.content,
        version=e.version,
        pinned=e.pinned,
        retrieval_count=e.retrieval_count,
        training_count=e.training_count,
        last_trained_step=e.last_trained_step,
        guided_successes=e.guided_successes,
        guided_failures=e.guided_failures,
        created_step=e.created_step,
        updated_step=e.updated_step,
        similarity=similarity,
        score=score,
    )


def generation_of(e: Experience) -> Generation:
    return _generation({field: getattr(e, field) for field in GENERATION_FIELDS})


def generation_at(entry_id: int, version: int) -> Generation | None:
    """The generation behind version ``version`` of an entry, from its history (None: no such version)."""
    change = (
        ExperienceChange.objects.filter(experience_id=entry_id, after__version=version)
        .order_by("-id")
        .first()
    )
    return _generation(change.after["generation"]) if change else None


def _generation(fields: dict[str, Any]) -> Generation:
    return Generation(
        prompt=fields["generation_prompt"],
        response=fields["generation_response"],
        token_ids=tuple(fields["generation_token_ids"]),
        logprobs=tuple(fields["generation_logprobs"]),
        weight_version=fields["generation_weight_version"],
    )


def set_generation(e: Experience, g: Generation | None) -> None:
    g = g or Generation()
    e.generation_prompt = g.prompt
    e.generation_response = g.response
    e.generation_token_ids = list(g.token_ids)
    e.generation_logprobs = list(g.logprobs)
    e.generation_weight_version = g.weight_version


def snapshot(e: Experience) -> dict[str, Any]:
    """Everything a change can alter, enough to restore it (the embedding is recomputed from the text)."""
    return {
        "title": e.title,
        "content": e.content,
        "scope": e.scope,
        "pinned": e.pinned,
        "deleted": e.deleted_at is not None,
        "version": e.version,
        "source_episode": e.source_episode,
        "updated_step": e.updated_step,
        "generation": {field: getattr(e, field) for field in GENERATION_FIELDS},
    }


def _record(
    e: Experience,
    kind: str,
    actor: str,
    before: dict | None,
    *,
    step: int | None = None,
    user=None,
    merge: Merge | None = None,
    batch: str = "",
) -> ExperienceChange:
    """One row of the entry's history. ``step``: the run's step the change belongs to; a person's pin or
    undo names none and gets the run's current step, so the history's steps never go backwards."""
    if step is None:
        step = e.run.step if e.run_id else e.updated_step
    return ExperienceChange.objects.create(
        batch=batch,
        experience=e,
        run_id=e.run_id,
        kind=kind,
        actor=actor,
        user=user,
        merge=merge,
        step=step,
        before=before,
        after=snapshot(e),
    )


def _locked(entry_id: int, run_id: int | None = None) -> Experience:
    """The entry, row-locked for this transaction; refuses an entry of another run."""
    try:
        e = Experience.objects.select_for_update().get(pk=entry_id)
    except Experience.DoesNotExist:
        raise BankError(f"experience #{entry_id} does not exist") from None
    if run_id is not None and e.run_id != run_id:
        raise BankError(f"experience #{entry_id} belongs to another run")
    return e


def _save_text(e: Experience, extra: Iterable[str] = ()) -> None:
    e.version += 1
    e.save(update_fields=[*TEXT_FIELDS, *extra, "updated_at"])


@transaction.atomic
def add(
    run_id: int | None,
    scope: str,
    title: str,
    content: str,
    vector: np.ndarray,
    *,
    embedding_model: str,
    step: int = 0,
    actor: str = Actor.EXTRACTOR,
    kind: str = Kind.ADD,
    user=None,
    generation: Generation | None = None,
    source_episode: str = "",
    merge: Merge | None = None,
    capacity: int | None = None,
    pinned: bool = False,
    restored: dict[str, Any] | None = None,
) -> Experience:
    """A new entry; ``restored`` sets model fields from an export (counters, steps) on import."""
    lock_bank(run_id)
    e = Experience(
        run_id=run_id,
        scope=scope,
        title=title,
        content=content,
        embedding=vector,
        embedding_model=embedding_model,
        source_episode=source_episode,
        created_step=step,
        updated_step=step,
        pinned=pinned,
    )
    for field, value in (restored or {}).items():
        setattr(e, field, value)
    set_generation(e, generation)
    e.save()
    _record(e, kind, actor, None, step=step, user=user, merge=merge)
    if capacity is not None:
        evict_over_capacity(run_id, capacity, step=step)
    return e


@transaction.atomic
def add_imported(run_id: int | None, entries: list[Experience], *, user=None) -> list[Experience]:
    """New entries from an import (built by ``experience.transfer``), inserted and recorded in bulk. New rows
    conflict with no other writer: the import takes the bank's lock only at its end (``transfer.commit``)."""
    created = Experience.objects.bulk_create(entries)
    ExperienceChange.objects.bulk_create(
        ExperienceChange(experience=e, run_id=run_id, kind=Kind.IMPORT, actor=Actor.IMPORT, user=user,
                         step=e.created_step, before=None, after=snapshot(e))
        for e in created
    )  # fmt: skip
    return created


@transaction.atomic
def update(
    entry_id: int,
    title: str,
    content: str,
    vector: np.ndarray,
    *,
    run_id: int | None = None,
    embedding_model: str,
    step: int = 0,
    actor: str = Actor.EXTRACTOR,
    kind: str = Kind.UPDATE,
    user=None,
    generation: Generation | None = None,
    source_episode: str | None = None,
    merge: Merge | None = None,
    expected_version: int | None = None,
) -> Experience:
    """New text (and, from the extractor, the generation that wrote it) for a live entry."""
    e = _locked(entry_id, run_id)
    lock_bank(e.run_id)
    if e.deleted_at is not None:
        raise EntryDeleted(f"experience #{entry_id} was deleted")
    _check_version(e, expected_version)
    before = snapshot(e)
    e.title, e.content, e.embedding, e.embedding_model = title, content, vector, embedding_model
    e.updated_step = step
    extra = ["updated_step"]
    if generation is not None:
        set_generation(e, generation)
        extra += GENERATION_FIELDS
    if source_episode is not None:
        e.source_episode = source_episode
        extra.append("source_episode")
    _save_text(e, extra)
    _record(e, kind, actor, before, step=step, user=user, merge=merge)
    return e


@transaction.atomic
def delete(
    entry_id: int,
    *,
    run_id: int | None = None,
    step: int = 0,
    actor: str = Actor.EXTRACTOR,
    kind: str = Kind.DELETE,
    user=None,
    merge: Merge | None = None,
    batch: str = "",
    expected_version: int | None = None,
) -> Experience:
    """Soft deletion: the row stays (history, undo, credit of its generation) but is never retrieved."""
    e = _locked(entry_id, run_id)
    lock_bank(e.run_id)
    if e.deleted_at is not None:
        raise EntryDeleted(f"experience #{entry_id} was already deleted")
    _check_version(e, expected_version)
    before = snapshot(e)
    e.deleted_at = timezone.now()
    _save_text(e)
    _record(e, kind, actor, before, step=step, user=user, merge=merge, batch=batch)
    return e


@transaction.atomic
def set_pinned(
    entry_id: int, pinned: bool, *, user=None, actor: str = Actor.PERSON, expected_version: int | None = None
) -> Experience:
    e = _locked(entry_id)
    lock_bank(e.run_id)
    if e.deleted_at is not None:
        raise EntryDeleted(f"experience #{entry_id} was deleted: restore it (undo) before pinning it")
    _check_version(e, expected_version)
    if e.pinned == pinned:
        return e
    before = snapshot(e)
    e.pinned = pinned
    _save_text(e)
    _record(e, Kind.PIN if pinned else Kind.UNPIN, actor, before, user=user)
    return e


def evict_over_capacity(run_id: int | None, capacity: int, *, step: int = 0) -> int:
    """FIFO eviction of the oldest unpinned live entries beyond ``capacity``; call inside a transaction."""
    excess = Experience.objects.in_bank(run_id).count() - capacity
    if excess <= 0:
        return 0
    oldest = (
        Experience.objects.in_bank(run_id).filter(pinned=False).order_by("id").values_list("id", flat=True)
    )
    victims = list(oldest[:excess])
    for entry_id in victims:
        delete(entry_id, step=step, actor=Actor.SYSTEM, kind=Kind.EVICT)
    return len(victims)


# ---- undo ------------------------------------------------------------------------------------------


def _restore(e: Experience, state: dict, embedder: Embedder) -> None:
    if (state["title"], state["content"]) != (e.title, e.content) or e.embedding_model != embedder.model_id:
        e.embedding = embedder.embed_one(entry_text(state["title"], state["content"]))
        e.embedding_model = embedder.model_id
    e.title, e.content, e.scope, e.pinned = state["title"], state["content"], state["scope"], state["pinned"]
    e.source_episode, e.updated_step = state["source_episode"], state["updated_step"]
    for field, value in state["generation"].items():
        setattr(e, field, value)
    if state["deleted"] != (e.deleted_at is not None):
        e.deleted_at = timezone.now() if state["deleted"] else None
    _save_text(e, ["source_episode", "updated_step", *GENERATION_FIELDS])


def _undo_one(change: ExperienceChange, embedder: Embedder, *, user=None) -> ExperienceChange:
    if change.undone_by_id is not None:
        raise BankError(f"change #{change.pk} was already undone")
    e = _locked(change.experience_id)
    if e.version != change.after["version"]:
        raise BankError(
            f"This change cannot be undone: the entry “{e.title}” was changed "
            f"again after it (it is at version {e.version}; this change left version "
            f"{change.after['version']}). To go back, undo the later changes first (newest first)."
        )
    before = snapshot(e)
    if change.before is None:  # the change created the entry: undoing it removes it
        if e.deleted_at is None:
            e.deleted_at = timezone.now()
        _save_text(e)
    else:
        _restore(e, change.before, embedder)
    undo = _record(e, Kind.UNDO, Actor.PERSON if user else Actor.SYSTEM, before, user=user)
    change.undone_by = undo
    change.save(update_fields=["undone_by"])
    return undo


@transaction.atomic
def undo_change(change_id: int, embedder: Embedder, *, user=None) -> ExperienceChange:
    """Revert one change; the entry must not have changed since. The undo is itself a change."""
    change = ExperienceChange.objects.select_for_update().get(pk=change_id)
    lock_bank(change.run_id)
    if change.merge_id is not None:
        raise BankError(f"change #{change.pk} is part of merge #{change.merge_id}: undo the whole merge")
    return _undo_one(change, embedder, user=user)


@transaction.atomic
def undo_merge(merge_id: int, embedder: Embedder, *, user=None) -> list[ExperienceChange]:
    """Revert every change of one merge chunk, newest first, all or nothing."""
    merge = Merge.objects.select_for_update().get(pk=merge_id)
    lock_bank(merge.run_id)
    if merge.undone_at is not None:
        raise BankError(f"merge #{merge.pk} was already undone")
    undos = [_undo_one(c, embedder, user=user) for c in merge.changes.order_by("-id")]
    merge.undone_at = timezone.now()
    merge.save(update_fields=["undone_at"])
    return undos


@transaction.atomic
def undo_batch(run_id: int | None, batch: str, embedder: Embedder, *, user=None) -> list[ExperienceChange]:
    """Revert every change of one bulk action (a prune), newest first, all or nothing."""
    lock_bank(run_id)
    changes = list(
        ExperienceChange.objects.select_for_update().filter(run_id=run_id, batch=batch).order_by("-id")
    )
    if not changes:
        raise BankError("nothing to undo: no change belongs to that action")
    if any(c.undone_by_id for c in changes):
        raise BankError("that action was already undone")
    return [_undo_one(c, embedder, user=user) for c in changes]


# ---- merge -----------------------------------------------------------------------------------------


def validate_plan(plan: MergePlan, chunk: Sequence[Entry]) -> list[MergeAction] | None:
    """The plan's actions if they make sense for this chunk, else None (treated as unparseable)."""
    if plan.actions is None:
        return None
    ids = {e.id for e in chunk}
    claimed: set[int] = set()
    for a in plan.actions:
        if not a.ids or not set(a.ids) <= ids:
            return None
        if a.kind == "keep":
            continue
        if claimed & set(a.ids) or len(set(a.ids)) != len(a.ids):
            return None
        claimed |= set(a.ids)
        if a.kind == "rewrite" and len(a.ids) != 1:
            return None
        if a.kind in ("rewrite", "merge") and not (a.title.strip() and a.content.strip()):
            return None
    return list(plan.actions)


def protect_pinned(actions: list[MergeAction], pinned: set[int]) -> list[MergeAction]:
    """Pinned entries are never changed or removed: drop them from discards and rewrites; a merge that
    includes one still creates its merged entry, but the pinned source stays as it is."""
    kept = []
    for a in actions:
        if a.kind in ("discard", "rewrite"):
            ids = tuple(i for i in a.ids if i not in pinned)
            if ids:
                kept.append(MergeAction(a.kind, ids, a.title, a.content))
        else:
            kept.append(a)
    return kept


def _snapshot_entry(e: Entry) -> dict[str, Any]:
    return {"id": e.id, "version": e.version, "title": e.title, "content": e.content, "pinned": e.pinned}


@transaction.atomic
def apply_merge_plan(
    run_id: int | None,
    scope: str,
    chunk: Sequence[Entry],
    plan: MergePlan,
    vectors: dict[tuple[str, str], np.ndarray],
    *,
    embedding_model: str,
    step: int,
    chunk_index: int,
    carry_max: int,
) -> tuple[Merge, list[int]]:
    """Apply one chunk's plan atomically and record it; returns the record and the ids to carry on.

    ``vectors`` holds embeddings of every (title, content) the plan writes, computed before the lock.
    If any entry changed since the merge function read it, nothing is applied (decision ``stale``).
    """
    lock_bank(run_id)
    merge = Merge(
        run_id=run_id,
        scope=scope,
        step=step,
        chunk=chunk_index,
        inputs=[_snapshot_entry(e) for e in chunk],
        raw_output=plan.raw,
    )
    if _changed_since_read(chunk):
        return _record_untouched(merge, Merge.Decision.STALE), []
    actions = validate_plan(plan, chunk)
    if actions is None:
        return _record_untouched(merge, Merge.Decision.UNPARSEABLE), []
    pinned = {e.id for e in chunk if e.pinned}
    actions = protect_pinned(actions, pinned)
    changing = [a for a in actions if a.kind != "keep"]
    merge.decision = Merge.Decision.CHANGED if changing else Merge.Decision.KEEP
    merge.actions = [
        {"kind": a.kind, "ids": list(a.ids), "title": a.title, "content": a.content} for a in actions
    ]
    merge.save()
    written = (
        _apply_merge_action(a, merge, plan.generation, vectors, pinned, embedding_model=embedding_model)
        for a in changing
    )
    outputs = [entry_id for entry_id in written if entry_id is not None]
    merge.outputs = outputs
    merge.carried = outputs[-carry_max:] if carry_max > 0 else []
    merge.save(update_fields=["outputs", "carried"])
    return merge, list(merge.carried)


def _changed_since_read(chunk: Sequence[Entry]) -> bool:
    """Lock the chunk's rows; True if any was edited or deleted after the merge function read it."""
    current = {
        e.pk: e
        for e in Experience.objects.select_for_update().filter(pk__in=[e.id for e in chunk]).order_by("id")
    }
    return any(current[e.id].version != e.version or current[e.id].deleted_at for e in chunk)


def _record_untouched(merge: Merge, decision: str) -> Merge:
    """Save the record of a chunk whose plan was not applied (stale entries or an unusable plan)."""
    merge.decision = decision
    merge.save()
    return merge


def _apply_merge_action(
    action: MergeAction,
    merge: Merge,
    generation: Generation | None,
    vectors: dict[tuple[str, str], np.ndarray],
    pinned: set[int],
    *,
    embedding_model: str,
) -> int | None:
    """Carry out one changing action of a merge plan; returns the entry it wrote (None for a discard)."""
    if action.kind == "discard":
        _remove_merged(action.ids, merge)
        return None
    vector = vectors[(action.title, action.content)]
    common = {"embedding_model": embedding_model, "step": merge.step, "actor": Actor.MERGE, "merge": merge}
    if action.kind == "rewrite":
        update(
            action.ids[0],
            action.title,
            action.content,
            vector,
            kind=Kind.MERGE_REWRITE,
            generation=generation,
            **common,
        )
        return action.ids[0]
    new = add(
        merge.run_id,
        merge.scope,
        action.title,
        action.content,
        vector,
        kind=Kind.MERGE_ADD,
        generation=generation,
        **common,
    )
    _remove_merged([i for i in action.ids if i not in pinned], merge)
    return new.pk


def _remove_merged(entry_ids: Iterable[int], merge: Merge) -> None:
    for entry_id in entry_ids:
        delete(entry_id, step=merge.step, actor=Actor.MERGE, kind=Kind.MERGE_REMOVE, merge=merge)

"""Export and import of a bank as JSONL: one entry per line with its text, scope, provenance and counters.

Embeddings travel with the entry and its ``embedding_model``; on import they are kept when the model
matches the importer's (and they are finite and not all zero), else recomputed from the text.
Export → import → export gives the same lines. Imported lines are validated by one declared schema
(``RecordIn``, pydantic): types, lengths, ranges, finiteness; ids, runs and owners never come from a file.

An import is streamed in three passes over the file, with memory bounded by one batch: validate every
line (a bad one rejects the import, naming each bad line), embed batches into staging rows
(``ImportRow``, committed as they go, so progress shows), then add the staged rows to the bank in one
transaction (all or nothing; the bank's locks are held only at its end, so the run's own writes go on).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import IO, Annotated, Any, AnyStr, Literal

from django.db import transaction
from django.utils import timezone
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from experience import bank, strict_json
from experience.embedding import Embedder
from experience.models import Experience, ImportJob, ImportRow

FORMAT = "complementary-rl-experience/1"
COUNTERS = [
    "retrieval_count",
    "last_retrieved_at",
    "training_count",
    "last_trained_step",
    "guided_successes",
    "guided_failures",
]


def entry_record(e: Experience) -> dict[str, Any]:
    counters = {field: getattr(e, field) for field in COUNTERS}
    if counters["last_retrieved_at"] is not None:
        counters["last_retrieved_at"] = counters["last_retrieved_at"].isoformat()
    return {
        "format": FORMAT,
        "scope": e.scope,
        "title": e.title,
        "content": e.content,
        "pinned": e.pinned,
        "provenance": {
            "source_episode": e.source_episode,
            "created_step": e.created_step,
            "updated_step": e.updated_step,
            "generation": {
                "prompt": e.generation_prompt,
                "response": e.generation_response,
                "token_ids": e.generation_token_ids,
                "logprobs": e.generation_logprobs,
                "weight_version": e.generation_weight_version,
            },
        },
        "counters": counters,
        "embedding_model": e.embedding_model,
        "embedding": [float(x) for x in e.embedding],
    }


def export_jsonl(run_id: int | None, out: IO[str], *, scope: str | None = None) -> int:
    """Write the run's live entries (oldest first); returns how many."""
    n = 0
    for e in Experience.objects.in_bank(run_id, scope).order_by("id").iterator(chunk_size=500):
        out.write(json.dumps(entry_record(e), ensure_ascii=False) + "\n")
        n += 1
    return n


# ---- import: every line is untrusted data, validated by one declared schema ---------------------------

TITLE_MAX = 300
SCOPE_MAX = 100
CONTENT_MAX = 20_000
"""Longest entry text accepted (an extractor entry is at most 600 characters; PostgreSQL's full-text
index refuses texts of about 1 MB)."""
TEXT_MAX = 100_000
"""Longest generation prompt or response kept with an entry."""
TOKENS_MAX = 16_384
LINE_MAX_BYTES = 2_000_000
"""Longest line read (longer ones are refused without being read into memory)."""
FILE_MAX_BYTES = 50 * 1024 * 1024
"""Largest file accepted from the web page."""
LINES_MAX = 200_000
"""Most entries one import may hold."""
BATCH_LINES = 256
BATCH_BYTES = 4_000_000
"""A batch of lines embedded and staged together: memory is bounded by this, not by the file."""
COMMIT_CHUNK = 500
"""Staged rows added to the bank per insert in the final transaction."""
COUNT_MAX = 2**31 - 1
STEP_MAX = 10**9
SHOWN_ERRORS = 10


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("contains a NUL character")
    return text


def _text(max_length: int, min_length: int = 0):
    return Annotated[
        str, StringConstraints(min_length=min_length, max_length=max_length), AfterValidator(_no_nul)
    ]


def _count(high: int = COUNT_MAX):
    return Annotated[int, Field(ge=0, le=high)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class GenerationIn(_Schema):
    prompt: _text(TEXT_MAX) = ""
    response: _text(TEXT_MAX) = ""
    token_ids: Annotated[list[_count()], Field(max_length=TOKENS_MAX)] = []
    logprobs: Annotated[list[float], Field(max_length=TOKENS_MAX)] = []
    weight_version: _count() | None = None


class ProvenanceIn(_Schema):
    source_episode: _text(200) = ""
    created_step: _count(STEP_MAX) = 0
    updated_step: _count(STEP_MAX) = 0
    generation: GenerationIn = GenerationIn()


class CountersIn(_Schema):
    """Usage counters only: ids, runs and owners are never taken from a file."""

    retrieval_count: _count() = 0
    last_retrieved_at: datetime | None = None
    training_count: _count() = 0
    last_trained_step: _count(STEP_MAX) | None = None
    guided_successes: _count() = 0
    guided_failures: _count() = 0


class RecordIn(_Schema):
    """One line of an experience export (``entry_record``)."""

    format: Literal["complementary-rl-experience/1"]
    scope: _text(SCOPE_MAX, 1)
    title: _text(TITLE_MAX, 1)
    content: _text(CONTENT_MAX, 1)
    pinned: bool = False
    provenance: ProvenanceIn = ProvenanceIn()
    counters: CountersIn = CountersIn()
    embedding_model: _text(200) = ""
    embedding: Annotated[list[float], Field(max_length=4096)] = []


class ImportRejected(ValueError):
    """An import with bad lines: nothing was imported; ``errors`` says what is wrong on which line."""

    def __init__(self, errors: list[str], lines: int, bad: int | None = None) -> None:
        self.errors = errors
        bad = len(errors) if bad is None else bad
        shown = "; ".join(errors[:SHOWN_ERRORS])
        more = f" (and {bad - len(errors[:SHOWN_ERRORS])} more)" if bad > SHOWN_ERRORS else ""
        super().__init__(f"{bad} of {lines} lines are not valid experience entries: {shown}{more}")


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False, include_input=False)[:3]:
        where = ".".join(str(x) for x in e["loc"])
        parts.append(f"{where + ': ' if where else ''}{e['msg']}")
    return ", ".join(parts)


def read_lines(source: IO[AnyStr], limit: int = LINE_MAX_BYTES) -> Iterator[tuple[int, AnyStr | None]]:
    """``(number, line)`` for every non-blank line of a text or binary file; ``None`` for a line longer
    than ``limit``, which is skipped without being held in memory."""
    number = 0
    while line := source.readline(limit + 1):
        number += 1
        if len(line) > limit:
            while line and not line.endswith(b"\n" if isinstance(line, bytes) else "\n"):
                line = source.readline(limit)
            yield number, None
        elif line.strip():
            yield number, line


def _parse(number: int, line: AnyStr | None) -> RecordIn:
    if line is None:
        raise ValueError(f"line {number}: longer than {LINE_MAX_BYTES:,} characters")
    try:
        record = RecordIn.model_validate_json(line)  # first: its messages name the field at fault
        strict_json.loads(line)  # pydantic's parser keeps a repeated key's last value
        return record
    except ValidationError as err:
        raise ValueError(f"line {number}: {_describe(err)}") from None
    except ValueError as err:
        raise ValueError(f"line {number}: {err}") from None


Progress = Callable[[str, int], None]


def validate(source: IO[AnyStr], progress: Progress | None = None) -> int:
    """Pass 1: check every line; returns how many, or raises ``ImportRejected`` naming the bad ones."""
    errors: list[str] = []
    n = bad = 0
    for number, line in read_lines(source):
        n += 1
        if n > LINES_MAX:
            raise ImportRejected([f"more than {LINES_MAX:,} entries in one file: split it"], n, 1)
        try:
            _parse(number, line)
        except ValueError as err:
            bad += 1
            if len(errors) < SHOWN_ERRORS:
                errors.append(str(err))
        if progress and n % 1000 == 0:
            progress(ImportJob.Status.VALIDATING, n)
    if bad:
        raise ImportRejected(errors, n, bad)
    return n


def _fields(record: RecordIn) -> dict[str, Any]:
    """The model fields of the entry a record becomes (JSON-serialisable; no id, run or owner)."""
    g = record.provenance.generation
    return {
        "scope": record.scope, "title": record.title, "content": record.content, "pinned": record.pinned,
        "source_episode": record.provenance.source_episode,
        "created_step": record.provenance.created_step, "updated_step": record.provenance.updated_step,
        "generation_prompt": g.prompt, "generation_response": g.response,
        "generation_token_ids": g.token_ids, "generation_logprobs": g.logprobs,
        "generation_weight_version": g.weight_version,
        **record.counters.model_dump(mode="json"),
    }  # fmt: skip


def _usable_embedding(record: RecordIn, embedder: Embedder) -> bool:
    v = record.embedding
    return record.embedding_model == embedder.model_id and len(v) == embedder.dim and any(x != 0 for x in v)


def _batches(source: IO[AnyStr]) -> Iterator[list[tuple[int, RecordIn]]]:
    batch, size = [], 0
    for number, line in read_lines(source):
        batch.append((number, _parse(number, line)))
        size += len(line)
        if len(batch) >= BATCH_LINES or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def stage(job: ImportJob, source: IO[AnyStr], embedder: Embedder, progress: Progress | None = None) -> int:
    """Pass 2: embed (where the file's vector is not usable) and store every line as an ``ImportRow``."""
    n = 0
    for batch in _batches(source):
        stale = [r for _, r in batch if not _usable_embedding(r, embedder)]
        vectors = embedder.embed([bank.entry_text(r.title, r.content) for r in stale], cache=False)
        fresh = {id(r): v for r, v in zip(stale, vectors, strict=True)}
        rows = [
            ImportRow(job=job, number=number, fields=_fields(r), embedding=fresh.get(id(r), r.embedding))
            for number, r in batch
        ]
        ImportRow.objects.bulk_create(rows)
        n += len(rows)
        if progress:
            progress(ImportJob.Status.EMBEDDING, n)
    return n


def commit(
    job: ImportJob,
    embedder: Embedder,
    *,
    capacity: int | None = None,
    writing: Callable[[], AbstractContextManager] = nullcontext,
) -> int:
    """Pass 3: add the staged rows to the job's bank in one transaction; returns how many.

    The rows go in without the bank's locks: new rows, seen by no one before the commit, conflict with no
    other writer, so the run's merges, edits and searches go on while a large import writes. The locks
    (``writing``, then ``bank.lock_bank``) are taken only for the end: eviction and the job's record."""
    with transaction.atomic():
        n = _insert_staged(job, embedder)
        job.rows.all().delete()
        with writing():
            bank.lock_bank(job.run_id)
            if capacity is not None:
                bank.evict_over_capacity(job.run_id, capacity)
            ImportJob.objects.filter(pk=job.pk).update(
                status=ImportJob.Status.SUCCEEDED, entries=n, finished_at=timezone.now()
            )
    return n


def _insert_staged(job: ImportJob, embedder: Embedder) -> int:
    n = last = 0
    while batch := list(job.rows.filter(number__gt=last).order_by("number")[:COMMIT_CHUNK]):
        last = batch[-1].number
        entries = [
            Experience(run_id=job.run_id, embedding=row.embedding, embedding_model=embedder.model_id,
                       **row.fields)
            for row in batch
        ]  # fmt: skip
        bank.add_imported(job.run_id, entries, user=job.user)
        n += len(entries)
    return n


class ImportCancelled(Exception):
    """Someone asked the import to stop (``ImportJob.cancel_requested``) before it wrote anything."""


def stop_if_cancelled(job: ImportJob) -> None:
    """Raise ``ImportCancelled`` if someone asked ``job`` to stop."""
    if ImportJob.objects.filter(pk=job.pk, cancel_requested=True).exists():
        raise ImportCancelled


def run_job(
    job: ImportJob,
    source: IO[AnyStr],
    embedder: Embedder,
    *,
    capacity: int | None = None,
    writing: Callable[[], AbstractContextManager] = nullcontext,
) -> int:
    """Validate, stage and commit ``source`` for ``job``; returns how many entries were added. A failure
    marks the job failed with its message, removes the staged rows and is raised again; nothing changes. A
    cancel asked for before the final pass (checked at every progress report) ends it the same way, as
    cancelled, returning 0.
    ``writing`` (the run's writer lock) guards the end of the final pass."""

    phase = {"status": None}

    def progress(status: str, done: int) -> None:
        stop_if_cancelled(job)
        now = timezone.now()
        began = {"phase_started_at": now} if status != phase["status"] else {}  # a new phase: its clock
        phase["status"] = status
        ImportJob.objects.filter(pk=job.pk).update(status=status, done=done, updated_at=now, **began)

    try:
        progress(ImportJob.Status.VALIDATING, 0)
        lines = validate(source, progress)
        ImportJob.objects.filter(pk=job.pk).update(lines=lines)
        source.seek(0)
        progress(ImportJob.Status.EMBEDDING, 0)  # its first batch may wait long for a core
        stage(job, source, embedder, progress)
        progress(ImportJob.Status.WRITING, lines)
        return commit(job, embedder, capacity=capacity, writing=writing)
    except ImportCancelled:
        job.rows.all().delete()
        ImportJob.objects.filter(pk=job.pk).update(
            status=ImportJob.Status.CANCELLED, finished_at=timezone.now()
        )
        return 0
    except Exception as err:
        job.rows.all().delete()
        job.mark_failed(str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}")
        raise


def import_jsonl(
    run_id: int | None,
    source: IO[AnyStr],
    embedder: Embedder,
    *,
    user=None,
    capacity: int | None = None,
    writing: Callable[[], AbstractContextManager] = nullcontext,
    file_name: str = "",
) -> int:
    """Add every entry of an export (a seekable text or binary file) to the run's bank, all or nothing;
    returns how many. A bad line rejects the import (``ImportRejected``) and nothing changes."""
    job = ImportJob.objects.create(run_id=run_id, user=user, file_name=file_name[:255])
    return run_job(job, source, embedder, capacity=capacity, writing=writing)

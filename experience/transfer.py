"""Export and import of a bank as JSONL: one entry per line with its text, scope, provenance and counters.

Embeddings travel with the entry and its ``embedding_model``; on import they are kept when the model
matches the importer's (and they are finite and not all zero), else recomputed from the text.
Export → import → export gives the same lines. Imported lines are validated by one declared schema
(``RecordIn``, pydantic): types, lengths, ranges, finiteness; ids, runs and owners never come from a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import IO, Annotated, Any, Literal

from django.db import transaction
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from experience import bank
from experience.embedding import Embedder
from experience.models import Experience, ExperienceChange

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

    def __init__(self, errors: list[str], lines: int) -> None:
        self.errors = errors
        shown = "; ".join(errors[:SHOWN_ERRORS])
        more = f" (and {len(errors) - SHOWN_ERRORS} more)" if len(errors) > SHOWN_ERRORS else ""
        super().__init__(f"{len(errors)} of {lines} lines are not valid experience entries: {shown}{more}")


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False, include_input=False)[:3]:
        where = ".".join(str(x) for x in e["loc"])
        parts.append(f"{where + ': ' if where else ''}{e['msg']}")
    return ", ".join(parts)


def parse_records(lines: Iterable[str | bytes]) -> list[RecordIn]:
    """Validate every non-empty line; raise ``ImportRejected`` naming each bad line by its number."""
    records, errors, n = [], [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        n += 1
        if len(line) > LINE_MAX_BYTES:
            errors.append(f"line {number}: longer than {LINE_MAX_BYTES:,} characters")
            continue
        try:
            records.append(RecordIn.model_validate_json(line))
        except ValidationError as err:
            errors.append(f"line {number}: {_describe(err)}")
    if errors:
        raise ImportRejected(errors, n)
    return records


def _generation(record: RecordIn) -> bank.Generation | None:
    g = record.provenance.generation
    if not (g.prompt or g.response or g.token_ids):
        return None
    return bank.Generation(g.prompt, g.response, tuple(g.token_ids), tuple(g.logprobs), g.weight_version)


def _usable_embedding(record: RecordIn, embedder: Embedder) -> bool:
    v = record.embedding
    return record.embedding_model == embedder.model_id and len(v) == embedder.dim and any(x != 0 for x in v)


def import_jsonl(
    run_id: int | None, lines: Iterable[str], embedder: Embedder, *, user=None, capacity: int | None = None
) -> int:
    """Add every entry of an export to the run's bank, all or nothing; returns how many. Every line is
    validated first (``RecordIn``); a bad one rejects the import with its line number and nothing changes.
    The caller holds the run's writer lock (``write_access``)."""
    records = parse_records(lines)
    stale = [r for r in records if not _usable_embedding(r, embedder)]
    vectors = embedder.embed([bank.entry_text(r.title, r.content) for r in stale])
    fresh = {id(r): v for r, v in zip(stale, vectors, strict=True)}
    with transaction.atomic():
        for r in records:
            restored = r.counters.model_dump() | {"updated_step": r.provenance.updated_step}
            bank.add(
                run_id, r.scope, r.title, r.content, fresh.get(id(r), r.embedding),
                embedding_model=embedder.model_id, step=r.provenance.created_step,
                actor=ExperienceChange.Actor.IMPORT, kind=ExperienceChange.Kind.IMPORT, user=user,
                generation=_generation(r), source_episode=r.provenance.source_episode, pinned=r.pinned,
                restored=restored,
            )  # fmt: skip
        if capacity is not None:
            bank.evict_over_capacity(run_id, capacity)
    return len(records)

"""Export and import of a bank as JSONL: one entry per line with its text, scope, provenance and counters.

Embeddings travel with the entry and its ``embedding_model``; on import they are kept when the model
matches the importer's, else recomputed from the text. Export → import → export gives the same lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO, Any

from django.db import transaction
from django.utils.dateparse import parse_datetime

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


def _generation(record: dict) -> bank.Generation:
    g = record["provenance"]["generation"]
    return bank.Generation(
        g["prompt"], g["response"], tuple(g["token_ids"]), tuple(g["logprobs"]), g["weight_version"]
    )


def import_jsonl(
    run_id: int | None, lines: Iterable[str], embedder: Embedder, *, user=None, capacity: int | None = None
) -> int:
    """Add every entry of an export to the run's bank, all or nothing; returns how many. The caller
    holds the run's writer lock (``write_access``)."""
    records = [json.loads(line) for line in lines if line.strip()]
    for i, r in enumerate(records, 1):
        if r.get("format") != FORMAT:
            raise ValueError(f"line {i}: not an experience export ({FORMAT!r} expected)")
    stale = [
        r
        for r in records
        if r.get("embedding_model") != embedder.model_id or len(r.get("embedding") or ()) != embedder.dim
    ]
    vectors = embedder.embed([bank.entry_text(r["title"], r["content"]) for r in stale])
    for r, vector in zip(stale, vectors, strict=True):
        r["embedding"] = vector
    with transaction.atomic():
        for r in records:
            restored = dict(r["counters"])
            if restored["last_retrieved_at"]:
                restored["last_retrieved_at"] = parse_datetime(restored["last_retrieved_at"])
            restored["updated_step"] = r["provenance"]["updated_step"]
            bank.add(
                run_id, r["scope"], r["title"], r["content"], r["embedding"],
                embedding_model=embedder.model_id, step=r["provenance"]["created_step"],
                actor=ExperienceChange.Actor.IMPORT,
                kind=ExperienceChange.Kind.IMPORT, user=user, generation=_generation(r),
                source_episode=r["provenance"]["source_episode"], pinned=r["pinned"], restored=restored,
            )  # fmt: skip
        if capacity is not None:
            bank.evict_over_capacity(run_id, capacity)
    return len(records)

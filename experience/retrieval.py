"""Retrieval diversification (docs/design.md §3.3), as pure functions testable on hand-made scores.

    s = s_rank − λ·log(1 + retrieval_count) − 1[retrieved within the last ``window`` seconds]

``s_rank`` is, by default, minus the candidate's rank among the oversampled candidates by similarity (0 for
the best, −1 for the next, …), as the authors' ``_diversify_uids_by_usage`` does: one rank step weighs as
much as the recency penalty, and a far less relevant unused entry cannot overtake a close one on usage
alone. ``relevance="similarity"`` uses the cosine similarity itself (1 − cosine distance; embeddings are
unit-norm), in [0, 1], where one past use (0.28) or a recent use (1.0) outweighs almost any difference in
relevance. Candidates are oversampled (``OVERSAMPLE`` × k by similarity), re-ranked by s, and the top k
kept: a popular or just-used entry yields to a slightly less similar one, which spreads credit over the
bank instead of letting one entry take every guided rollout. Identical queries of one batch (the guided
rollouts of one task) share one search and are then served in turn (``rerank_in_turn``), exactly as if
they had been retrieved one after another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime

LAMBDA = 0.4
RECENCY_WINDOW_S = 300.0
OVERSAMPLE = 16
RELEVANCE = ("rank", "similarity")
"""What s_rank is: minus the similarity rank (the authors' code, default) or the cosine similarity."""


def diversified_score(
    relevance: float,
    retrieval_count: int,
    seconds_since_retrieved: float | None,
    *,
    lam: float = LAMBDA,
    window_s: float = RECENCY_WINDOW_S,
) -> float:
    """s for one candidate from its s_rank (``relevance``); ``seconds_since_retrieved`` is None if it was
    never retrieved."""
    recent = seconds_since_retrieved is not None and seconds_since_retrieved < window_s
    return relevance - lam * math.log1p(retrieval_count) - (1.0 if recent else 0.0)


@dataclass(frozen=True)
class Candidate:
    id: int
    similarity: float
    retrieval_count: int
    last_retrieved_at: datetime | None
    score: float | None = None


def rerank(
    candidates: list[Candidate],
    k: int,
    now: datetime,
    *,
    diversify: bool = True,
    lam: float = LAMBDA,
    window_s: float = RECENCY_WINDOW_S,
    relevance: str = "rank",
) -> list[Candidate]:
    """The ``k`` best candidates by s (by similarity alone when ``diversify`` is off), scores filled in.

    Ties keep the similarity order (the sort is stable, and candidates are ranked most similar first).
    """
    if relevance not in RELEVANCE:
        raise ValueError(f"relevance must be one of {RELEVANCE} (got {relevance!r})")
    candidates = sorted(candidates, key=lambda c: -c.similarity)
    scored = []
    for rank, c in enumerate(candidates):
        if diversify:
            since = None if c.last_retrieved_at is None else (now - c.last_retrieved_at).total_seconds()
            s_rank = float(-rank) if relevance == "rank" else c.similarity
            score = diversified_score(s_rank, c.retrieval_count, since, lam=lam, window_s=window_s)
        else:
            score = c.similarity
        scored.append(replace(c, score=score))
    scored.sort(key=lambda c: -c.score)
    return scored[:k]


def rerank_in_turn(
    candidates: list[Candidate],
    k: int,
    n: int,
    now: datetime,
    *,
    diversify: bool = True,
    lam: float = LAMBDA,
    window_s: float = RECENCY_WINDOW_S,
    relevance: str = "rank",
) -> list[list[Candidate]]:
    """What ``n`` identical queries retrieving one after another would get from one shared search: each
    pick counts as a retrieval made ``now`` before the next query is ranked, so under diversification the
    guided rollouts of one task spread over the bank instead of all taking the same entry."""
    out = []
    for _ in range(n):
        chosen = rerank(
            candidates, k, now, diversify=diversify, lam=lam, window_s=window_s, relevance=relevance
        )
        out.append(chosen)
        picked = {c.id for c in chosen}
        candidates = [
            replace(c, retrieval_count=c.retrieval_count + 1, last_retrieved_at=now) if c.id in picked else c
            for c in candidates
        ]
    return out

"""The diversification formula on hand-made scores (no database)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from experience.retrieval import Candidate, diversified_score, rerank, rerank_in_turn

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_score_is_similarity_minus_popularity_minus_recency():
    assert diversified_score(0.9, 0, None) == pytest.approx(0.9)
    assert diversified_score(0.9, 3, None) == pytest.approx(0.9 - 0.4 * math.log(4))
    assert diversified_score(0.9, 3, 299.0) == pytest.approx(0.9 - 0.4 * math.log(4) - 1.0)
    assert diversified_score(0.9, 3, 300.0) == pytest.approx(0.9 - 0.4 * math.log(4))
    assert diversified_score(0.5, 7, 10.0, lam=0.1, window_s=5.0) == pytest.approx(0.5 - 0.1 * math.log(8))


def test_rerank_fills_exact_scores_and_orders_by_them():
    candidates = [
        Candidate(1, 0.95, 20, NOW - timedelta(hours=1)),  # 0.95 - 0.4 ln 21 = -0.2678
        Candidate(2, 0.90, 0, NOW - timedelta(seconds=30)),  # 0.90 - 1 = -0.10
        Candidate(3, 0.80, 1, None),  # 0.80 - 0.4 ln 2 = 0.5227
        Candidate(4, 0.60, 0, None),  # 0.60
    ]
    top = rerank(candidates, 4, NOW)
    assert [c.id for c in top] == [4, 3, 2, 1]
    expected = {1: 0.95 - 0.4 * math.log(21), 2: -0.1, 3: 0.8 - 0.4 * math.log(2), 4: 0.6}
    for c in top:
        assert c.score == pytest.approx(expected[c.id])
    assert [c.id for c in rerank(candidates, 2, NOW)] == [4, 3]


def test_without_diversification_similarity_decides():
    candidates = [Candidate(1, 0.95, 20, NOW), Candidate(2, 0.5, 0, None)]
    top = rerank(candidates, 1, NOW, diversify=False)
    assert [(c.id, c.score) for c in top] == [(1, 0.95)]


def test_ties_keep_similarity_order():
    candidates = [Candidate(1, 0.7, 0, None), Candidate(2, 0.7, 0, None)]
    assert [c.id for c in rerank(candidates, 2, NOW)] == [1, 2]


def test_identical_queries_served_in_turn_spread_over_the_candidates():
    candidates = [Candidate(1, 0.9, 0, None), Candidate(2, 0.8, 0, None), Candidate(3, 0.5, 0, None)]
    picks = rerank_in_turn(candidates, 1, 4, NOW)
    # 1st: 0.9; then 1 is recent and once retrieved: 0.9 - 0.4 ln 2 - 1 = -0.377 < 0.8; then 2 likewise
    # (-0.477) < 0.5; 4th: 3 drops to -0.777, and 1 (-0.377) leads again
    assert [[c.id for c in chosen] for chosen in picks] == [[1], [2], [3], [1]]
    assert picks[1][0].score == pytest.approx(0.8)
    assert picks[3][0].score == pytest.approx(0.9 - 0.4 * math.log(2) - 1.0)
    assert [[c.id for c in chosen] for chosen in rerank_in_turn(candidates, 2, 2, NOW)] == [[1, 2], [3, 1]]
    plain = rerank_in_turn(candidates, 1, 3, NOW, diversify=False)
    assert [(c.id, c.score) for [c] in plain] == [(1, 0.9)] * 3
    assert candidates[0].retrieval_count == 0  # the caller's candidates are left as they were

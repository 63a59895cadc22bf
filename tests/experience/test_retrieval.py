"""The diversification formula on hand-made scores (no database): s_rank = −rank (the default, as the
authors' ``_diversify_uids_by_usage``) and the cosine-similarity variant."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from experience.retrieval import Candidate, diversified_score, rerank, rerank_in_turn

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_score_is_relevance_minus_popularity_minus_recency():
    assert diversified_score(0.9, 0, None) == pytest.approx(0.9)
    assert diversified_score(0.9, 3, None) == pytest.approx(0.9 - 0.4 * math.log(4))
    assert diversified_score(0.9, 3, 299.0) == pytest.approx(0.9 - 0.4 * math.log(4) - 1.0)
    assert diversified_score(0.9, 3, 300.0) == pytest.approx(0.9 - 0.4 * math.log(4))
    assert diversified_score(0.5, 7, 10.0, lam=0.1, window_s=5.0) == pytest.approx(0.5 - 0.1 * math.log(8))


def test_with_similarity_relevance_rerank_fills_exact_scores_and_orders_by_them():
    candidates = [
        Candidate(1, 0.95, 20, NOW - timedelta(hours=1)),  # 0.95 - 0.4 ln 21 = -0.2678
        Candidate(2, 0.90, 0, NOW - timedelta(seconds=30)),  # 0.90 - 1 = -0.10
        Candidate(3, 0.80, 1, None),  # 0.80 - 0.4 ln 2 = 0.5227
        Candidate(4, 0.60, 0, None),  # 0.60
    ]
    top = rerank(candidates, 4, NOW, relevance="similarity")
    assert [c.id for c in top] == [4, 3, 2, 1]
    expected = {1: 0.95 - 0.4 * math.log(21), 2: -0.1, 3: 0.8 - 0.4 * math.log(2), 4: 0.6}
    for c in top:
        assert c.score == pytest.approx(expected[c.id])
    assert [c.id for c in rerank(candidates, 2, NOW, relevance="similarity")] == [4, 3]


def test_by_default_relevance_is_minus_the_similarity_rank():
    candidates = [  # arrive in any order: ranks come from similarity
        Candidate(4, 0.60, 0, None),  # rank 3: -3
        Candidate(1, 0.95, 20, NOW - timedelta(hours=1)),  # rank 0: 0 - 0.4 ln 21 = -1.2178
        Candidate(3, 0.80, 1, None),  # rank 2: -2 - 0.4 ln 2 = -2.2773
        Candidate(2, 0.90, 0, NOW - timedelta(seconds=30)),  # rank 1: -1 - 1 = -2
    ]
    top = rerank(candidates, 4, NOW)
    assert [c.id for c in top] == [1, 2, 3, 4]
    expected = {1: -0.4 * math.log(21), 2: -2.0, 3: -2.0 - 0.4 * math.log(2), 4: -3.0}
    for c in top:
        assert c.score == pytest.approx(expected[c.id])


def test_a_far_less_relevant_unused_entry_wins_only_under_similarity():
    # the case: a close entry used once long ago vs an unrelated one never used
    close, far = Candidate(1, 0.82, 3, NOW - timedelta(hours=2)), Candidate(2, 0.31, 0, None)
    # similarity: 0.82 - 0.4 ln 4 = 0.265 < 0.31; rank: 0 - 0.4 ln 4 = -0.555 > -1
    assert [c.id for c in rerank([close, far], 1, NOW, relevance="similarity")] == [2]
    assert [c.id for c in rerank([close, far], 1, NOW)] == [1]


def test_a_recent_use_demotes_an_entry_by_one_rank_step_under_rank():
    best, second, third = Candidate(1, 0.9, 0, NOW), Candidate(2, 0.85, 0, None), Candidate(3, 0.2, 0, None)
    # best: 0 - 1 (recent) = -1 ties second's -1: the stable sort keeps the more similar one first
    assert [c.id for c in rerank([best, second, third], 3, NOW)] == [1, 2, 3]
    used = Candidate(1, 0.9, 1, NOW)  # recent and once retrieved: -1 - 0.277
    assert [c.id for c in rerank([used, second, third], 3, NOW)] == [2, 1, 3]


def test_an_unknown_relevance_is_refused():
    with pytest.raises(ValueError, match="relevance"):
        rerank([Candidate(1, 0.9, 0, None)], 1, NOW, relevance="cosine")


def test_without_diversification_similarity_decides():
    candidates = [Candidate(1, 0.95, 20, NOW), Candidate(2, 0.5, 0, None)]
    top = rerank(candidates, 1, NOW, diversify=False)
    assert [(c.id, c.score) for c in top] == [(1, 0.95)]


def test_ties_keep_similarity_order():
    candidates = [Candidate(1, 0.7, 0, None), Candidate(2, 0.7, 0, None)]
    assert [c.id for c in rerank(candidates, 2, NOW)] == [1, 2]


def test_identical_queries_served_in_turn_spread_over_the_candidates():
    candidates = [Candidate(1, 0.9, 0, None), Candidate(2, 0.8, 0, None), Candidate(3, 0.5, 0, None)]
    # ranks 0, -1, -2. 1st: 1 (0). 2nd: 1 is recent, once used: -1.277 < 2's -1. 3rd: 1 (-1.277) beats 2
    # (-2.277) and 3 (-2). 4th: 1, used twice: -1 - 0.4 ln 3 = -1.439, still ahead of 3 (-2): relevance wins
    picks = rerank_in_turn(candidates, 1, 4, NOW)
    assert [[c.id for c in chosen] for chosen in picks] == [[1], [2], [1], [1]]
    assert picks[2][0].score == pytest.approx(-1.0 - 0.4 * math.log(2))
    assert picks[3][0].score == pytest.approx(-1.0 - 0.4 * math.log(3))


def test_with_similarity_identical_queries_served_in_turn_spread_over_the_candidates():
    candidates = [Candidate(1, 0.9, 0, None), Candidate(2, 0.8, 0, None), Candidate(3, 0.5, 0, None)]
    picks = rerank_in_turn(candidates, 1, 4, NOW, relevance="similarity")
    # 1st: 0.9; then 1 is recent and once retrieved: 0.9 - 0.4 ln 2 - 1 = -0.377 < 0.8; then 2 likewise
    # (-0.477) < 0.5; 4th: 3 drops to -0.777, and 1 (-0.377) leads again
    assert [[c.id for c in chosen] for chosen in picks] == [[1], [2], [3], [1]]
    assert picks[1][0].score == pytest.approx(0.8)
    assert picks[3][0].score == pytest.approx(0.9 - 0.4 * math.log(2) - 1.0)
    in_pairs = rerank_in_turn(candidates, 2, 2, NOW, relevance="similarity")
    assert [[c.id for c in chosen] for chosen in in_pairs] == [[1, 2], [3, 1]]
    plain = rerank_in_turn(candidates, 1, 3, NOW, diversify=False)
    assert [(c.id, c.score) for [c] in plain] == [(1, 0.9)] * 3
    assert candidates[0].retrieval_count == 0  # the caller's candidates are left as they were

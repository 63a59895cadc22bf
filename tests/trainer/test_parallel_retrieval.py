"""Every rank plays experience-guided episodes (issue 47): on 1, 2 and 4 processes the same batch of guided
and free episodes, whose experiences rank 0's retriever serves to every rank, makes the same retrieval calls
(the same queries in the same order, the same answers) and the same episodes; guided episodes play on ranks
other than 0. ``dist_worker.py retrieval`` plays them (a tiny random Llama, an HF engine per rank, gloo)."""

from __future__ import annotations

import pytest

from tests.trainer.test_parallel import _run
from tests.trainer.tiny_models import tiny_llama_folder
from trainer.config import get_preset
from trainer.plan import Devices, plan_run


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> dict[int, dict]:
    model = tiny_llama_folder(tmp_path_factory.mktemp("tiny"))
    return {n: _run(tmp_path_factory.mktemp(f"n{n}"), "retrieval", n, str(model)) for n in (1, 2, 4)}


def test_the_bank_answers_the_same_calls_in_the_same_order_on_any_number_of_ranks(played):
    one = played[1]
    assert [len(call) for call in one["calls"]] == [4, 2]  # one call a batch: its guided episodes' queries
    assert all(len(set(call)) == 2 for call in one["calls"])  # two task instances a batch: the order shows
    for n in (2, 4):
        assert played[n]["calls"] == one["calls"], n
        assert played[n]["experiences"] == one["experiences"], n
    guided = [e for e, spec in zip(one["experiences"], one["specs"], strict=True) if spec.guided]
    assert all(e is not None for e in guided) and len({e.text for e in guided}) > 1
    assert all(e is None for e, spec in zip(one["experiences"], one["specs"], strict=True) if not spec.guided)


def test_the_same_episodes_play_on_one_two_and_four_ranks(played):
    one = played[1]
    assert len(one["specs"]) == 10
    for n in (2, 4):
        assert played[n]["specs"] == one["specs"]
        assert played[n]["systems"] == one["systems"]  # the experience injected into each prompt
        assert played[n]["ids"] == one["ids"] and played[n]["actions"] == one["actions"], n
    assert len({tuple(a) for a in one["actions"]}) > 1  # sampled: the seeds differ, so do the episodes


@pytest.mark.parametrize("n", [2, 4])
def test_guided_episodes_play_on_every_rank(played, n):
    ranks = played[n]["played"]
    assert len(ranks) == n
    assert sorted(map(repr, (s for specs in ranks for s in specs))) == sorted(map(repr, played[1]["specs"]))
    for rank, specs in enumerate(ranks):
        assert any(s.guided for s in specs), rank  # the step's 4 guided episodes: at least one on each rank
        assert any(not s.guided for s in specs), rank


def test_an_error_in_rank_0s_retriever_reaches_every_rank_instead_of_hanging_them(tmp_path):
    errors = _run(tmp_path, "serve_error", 2)["errors"]
    assert errors[0] == "KeyError: 'no entry for [0, 1]'"  # rank 0 served both ranks' items, in item order
    assert errors[1].startswith("RuntimeError: rank 0 failed to serve rank 1's items: KeyError")


def test_the_plan_counts_every_ranks_share_of_guided_episodes_when_they_cannot_ask():
    cfg = get_preset("cpu").with_overrides(nproc=4, tasks_per_step=2, k_rollouts=8, eval_episodes=2)
    devices = Devices.parse("cpu:24GB")
    asks = plan_run(cfg, devices)
    assert "live episodes (8 at once)" in {p.name for p in asks.parts}  # 2 tasks × 4 guided on rank 0
    spread = plan_run(cfg.with_overrides(no_search_and_ask=True), devices)
    assert "live episodes (4 at once)" in {p.name for p in spread.parts}  # 16 / 4, guided or not
    assert "every rank plays its share" in spread.notes[0] and "every guided" in asks.notes[0]
    paper, node = get_preset("paper"), Devices.parse("8x80GB")  # 8 GPUs divide the rollout time
    assert plan_run(paper.with_overrides(no_search_and_ask=True), node).step_s < plan_run(paper, node).step_s

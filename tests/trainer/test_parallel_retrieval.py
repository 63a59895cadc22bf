"""Every rank plays experience-guided episodes (issue 47): on 1 and 4 processes the same batch of guided
and free episodes, whose experiences rank 0's retriever serves to every rank and whose guided episodes ask
the bank mid-episode (Search-and-Ask), makes the same retrieval calls and searches (the same queries in the
same order, the same answers), records each exchange once, and plays the same episodes; guided episodes
play, and ask, on ranks other than 0. ``dist_worker.py retrieval`` plays them (a tiny random Llama, an HF
engine per rank, gloo)."""

from __future__ import annotations

import pytest

from tests.trainer.test_parallel import _run
from tests.trainer.tiny_models import tiny_llama_folder
from trainer.config import get_preset
from trainer.plan import Devices, plan_run

RANKS = 4
"""Against one process (2 processes: tests/trainer/test_parallel_parity.py)."""


@pytest.fixture(scope="module")
def played(tmp_path_factory) -> dict[int, dict]:
    model = tiny_llama_folder(tmp_path_factory.mktemp("tiny"))
    return {n: _run(tmp_path_factory.mktemp(f"n{n}"), "retrieval", n, str(model)) for n in (1, RANKS)}


def test_the_bank_answers_the_same_calls_in_the_same_order_on_any_number_of_ranks(played):
    one = played[1]
    assert [len(call) for call in one["calls"]] == [4, 2]  # one call a batch: its guided episodes' queries
    assert all(len(set(call)) == 2 for call in one["calls"])  # two task instances a batch: the order shows
    assert played[RANKS]["calls"] == one["calls"]
    assert played[RANKS]["experiences"] == one["experiences"]
    guided = [e for e, spec in zip(one["experiences"], one["specs"], strict=True) if spec.guided]
    assert all(e is not None for e in guided) and len({e.text for e in guided}) > 1
    assert all(e is None for e, spec in zip(one["experiences"], one["specs"], strict=True) if not spec.guided)


def test_the_same_episodes_play_on_one_and_four_ranks(played):
    one = played[1]
    assert len(one["specs"]) == 10
    many = played[RANKS]
    assert many["specs"] == one["specs"]
    assert many["systems"] == one["systems"]  # the experience injected into each prompt
    assert many["observations"] == one["observations"]  # the bank's answers among them
    assert many["ids"] == one["ids"] and many["actions"] == one["actions"]
    assert len({tuple(a) for a in one["actions"]}) > 1  # sampled: the seeds differ, so do the episodes


def test_search_and_ask_searches_and_records_every_ranks_questions_once_in_the_same_order(played):
    one = played[1]
    limit = 2  # the cpu preset's experience.search_and_ask_max
    training = one["specs"][:8]  # then 2 evaluation episodes, which do not ask
    asked = [sum(i) for i in one["intercepted"][:8]]
    assert asked == [limit if s.guided else 0 for s in training]  # guided ones up to the limit, free never
    assert not any(any(i) for i in one["intercepted"][8:])
    assert len(one["searches"]) == len(one["exchanges"]) == len(one["traces"]) == 4 * limit
    assert [q for (q,), _ in one["searches"]] == [e[0] for e in one["exchanges"]]  # searched, then recorded
    assert len({e[0] for e in one["exchanges"]}) == 4  # 2 rooms x 2 turns: the order shows
    guided = [obs for obs, s in zip(one["observations"], training, strict=False) if s.guided]
    assert all(o.startswith("Experience bank answer to 'way out of room") for obs in guided for o in obs[1:])
    assert [t["exchange_id"] for t in one["traces"]] == list(range(1, 4 * limit + 1))
    for key in ("searches", "exchanges", "traces", "refinements"):
        assert played[RANKS][key] == one[key], key
    assert sorted(one["refinements"].values()) == [limit] * 4  # credited to each asking episode


def test_questions_are_asked_on_every_rank_that_plays_guided_episodes(played):
    many = played[RANKS]
    for rank, specs in enumerate(many["played"]):
        owned = [i for i, s in enumerate(many["specs"][:8]) if s in specs]
        assert any(any(many["intercepted"][i]) for i in owned), rank


def test_guided_episodes_play_on_every_rank(played):
    ranks = played[RANKS]["played"]
    assert len(ranks) == RANKS
    assert sorted(map(repr, (s for specs in ranks for s in specs))) == sorted(map(repr, played[1]["specs"]))
    for rank, specs in enumerate(ranks):
        assert any(s.guided for s in specs), rank  # the step's 4 guided episodes: at least one on each rank
        assert any(not s.guided for s in specs), rank


def test_an_error_in_rank_0s_retriever_reaches_every_rank_instead_of_hanging_them(tmp_path):
    errors = _run(tmp_path, "serve_error", 2)["errors"]
    assert errors[0] == "KeyError: 'no entry for [0, 1]'"  # rank 0 served both ranks' items, in item order
    assert errors[1].startswith("RuntimeError: rank 0 failed to serve rank 1's items: KeyError")


def test_the_plan_counts_every_ranks_share_of_guided_episodes_whether_they_may_ask_or_not():
    cfg = get_preset("cpu").with_overrides(nproc=4, tasks_per_step=2, k_rollouts=8, eval_episodes=2)
    devices = Devices.parse("cpu:24GB")
    for asks in (cfg, cfg.with_overrides(no_search_and_ask=True)):
        plan = plan_run(asks, devices)
        assert "live episodes (4 at once)" in {p.name for p in plan.parts}  # 16 / 4, guided or not
        assert "every rank plays its share" in plan.notes[0]
    paper, node = get_preset("paper"), Devices.parse("8x80GB")  # 8 GPUs divide the rollout time
    assert plan_run(paper, node).step_s < plan_run(paper, node, nproc=1).step_s

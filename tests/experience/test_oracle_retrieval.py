"""The dark-room pool's oracle bank through the normal retrieval path: imported as an experiment variant's
starting bank is, then retrieved by the run's own store (PostgreSQL + pgvector, all-MiniLM-L6-v2) for the
queries the runner makes at each room's start. Every room must get its own entry, again and again: the pool's
config ranks by similarity alone, so a room's second guided rollout is not handed another room's entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from experience.services import experience_import
from trainer.coevolution import BankRetriever
from trainer.config import RunConfig
from trainer.envs import make_env
from trainer.envs.minihack_pool import POOL_ENV, load_pool, write_oracle_bank
from trainer.rollout.runner import RetrievalQuery
from webapp.training import experience_store

pytestmark = pytest.mark.django_db(transaction=True)
CONFIG = Path(__file__).resolve().parents[2] / "configs/cpu-dark-pool-grpo-lora.toml"


def room_queries() -> list[RetrievalQuery]:
    env = make_env(POOL_ENV, split="eval")
    try:
        queries = []
        for index in range(len(load_pool())):
            obs, info = env.reset(index)
            queries.append(RetrievalQuery(POOL_ENV, info["goal"], obs))
        return queries
    finally:
        env.close()


def test_every_room_retrieves_its_own_oracle_entry_every_time(run, tmp_path):
    bank = tmp_path / "oracle.jsonl"
    write_oracle_bank(bank)
    with bank.open() as lines:
        assert experience_import(run, lines) == 16
    cfg = RunConfig.from_file(CONFIG).with_overrides(method="static_online", frozen_bank=True)
    queries = room_queries()
    with experience_store(run, cfg) as store:
        retrieve = BankRetriever(store, cfg)
        for _ in range(3):  # counted retrievals, one after another: usage must not move a room off its entry
            found = retrieve(queries + queries)  # and two guided rollouts of one room in one batch
            names = [exp.text.split(" room:")[0].removeprefix("The ") for exp in found]
            assert names == [room.name for room in load_pool()] * 2


def test_with_the_default_diversification_a_second_rollout_gets_another_rooms_entry(run, tmp_path):
    """Why the pool's config turns the usage and recency penalties off: under the defaults, the second of two
    identical queries is served a different entry (``rerank_in_turn``)."""
    bank = tmp_path / "oracle.jsonl"
    write_oracle_bank(bank)
    with bank.open() as lines:
        experience_import(run, lines)
    cfg = RunConfig.from_file(CONFIG).with_overrides(
        method="static_online", **{"experience.diversity_lambda": 0.4, "experience.recency_window_s": 300.0}
    )
    query = room_queries()[0]
    with experience_store(run, cfg) as store:
        first, second = BankRetriever(store, cfg)([query, query])
    assert first.text.startswith("The amber room") and not second.text.startswith("The amber room")

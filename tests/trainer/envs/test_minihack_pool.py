"""The dark-room pool on the real NetHack engine: the frozen rooms, their oracle entries checked against the
environment, and the scripted ceiling (an explorer without and with a room's entry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.envs import make_env
from trainer.envs.minihack_pool import (
    POOL_ENV,
    ROOM_NAMES,
    describe_way,
    load_pool,
    oracle_entries,
    write_oracle_bank,
)
from trainer.experiments.ceiling import parse_way, play_scripted, scripted_rows, totals
from trainer.experiments.spec import ExperimentSpec


@pytest.fixture(scope="module")
def env():
    made = make_env(POOL_ENV, split="eval")
    yield made
    made.close()


@pytest.fixture(scope="module")
def entries():
    return oracle_entries()


def test_the_pool_is_frozen_named_and_its_stairs_are_out_of_sight(env):
    rooms = load_pool()
    assert [r.name for r in rooms] == list(ROOM_NAMES)
    assert len({r.level_seed for r in rooms}) == len(rooms) == env.num_instances() == 16
    for index, room in enumerate(rooms):
        obs, info = env.reset(index)
        assert f"This is the {room.name} room." in info["goal"]
        assert env._agent() == room.start
        assert "staircase down" not in obs.split("Map", 1)[1]
        level = env._reveal_level()
        assert level[room.stairs] == "staircase down"


def test_training_plays_the_same_rooms_as_evaluation():
    train = make_env(POOL_ENV, split="train")
    try:
        for seed in (3, 16 + 3, 987_654_321):
            _, info = train.reset(seed)
            assert f"the {ROOM_NAMES[seed % 16]} room" in info["goal"]
            assert train._agent() == load_pool()[seed % 16].start
    finally:
        train.close()


def test_each_room_has_one_oracle_entry_and_following_it_reaches_the_stairs(env, entries):
    rooms = load_pool()
    assert len(entries) == len(rooms)
    for index, (room, entry) in enumerate(zip(rooms, entries, strict=True)):
        assert entry["scope"] == POOL_ENV and entry["pinned"] is True
        assert f"the {room.name} room" in entry["title"].lower()
        moves = parse_way(entry["content"])
        east, south = room.offset
        assert len(moves) == max(abs(east), abs(south))  # a shortest way in an open room
        env.reset(index)
        info: dict = {}
        for move in moves:
            assert not env.done
            _, _, _, info = env.step(move)
        assert info["success"], (
            f"the {room.name} room's entry does not lead to its stairs: {entry['content']}"
        )


def test_another_rooms_way_does_not_reach_these_stairs(env, entries):
    """The entries are specific: room 0's way, followed in a room whose stairs lie elsewhere, fails."""
    moves = parse_way(entries[0]["content"])
    other = next(i for i, r in enumerate(load_pool()) if r.offset != load_pool()[0].offset)
    assert not play_scripted(env, other, moves, turn_limit=len(moves))["success"]


def test_the_oracle_bank_file_reads_as_a_bank_export(tmp_path, entries):
    path = tmp_path / "oracle.jsonl"
    assert write_oracle_bank(path) == 16
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == entries
    assert all(line["format"] == "complementary-rl-experience/1" for line in lines)


def test_ways_are_described_and_read_back():
    moves = ["north", "northeast", "northeast", "east"]
    assert describe_way(moves) == "north, then northeast 2 times, then east"
    content = f"From the start, move {describe_way(moves)} (4 moves in all)."
    assert parse_way(content) == moves
    assert parse_way("From the start, move sideways 2 times (2 moves in all).") == []
    assert parse_way("no way here") == []


def test_the_scripted_ceiling_an_entry_turns_a_search_into_a_walk():
    rows = scripted_rows(turn_limit=8)
    table = totals(rows, ("without", "with"))
    assert table["with"]["success"] == 1.0
    assert table["with"]["actions"] <= 4
    # in the dark, 8 moves do not find every room's stairs; given 15 they do
    assert table["without"]["success"] < 1.0
    assert table["without"]["actions"] > table["with"]["actions"]
    assert totals(scripted_rows(turn_limit=None), ("without",))["without"]["success"] == 1.0


def test_the_committed_oracle_bank_and_the_grid_use_it_as_written(entries):
    root = Path(__file__).resolve().parents[3]
    committed = root / "configs/experiments/dark-pool-oracle.jsonl"
    assert [json.loads(line) for line in committed.read_text().splitlines()] == entries
    spec = ExperimentSpec.from_file(root / "configs/experiments/dark-pool.toml")
    oracle = [c for c in spec.cells() if c.arm == "static_online+oracle"]
    assert len(oracle) == 5 and all(c.bank == committed and c.config.frozen_bank for c in oracle)
    assert {c.config.env for c in spec.cells()} == {POOL_ENV}
    assert {c.config.experience.placement for c in spec.cells()} == {"turn"}

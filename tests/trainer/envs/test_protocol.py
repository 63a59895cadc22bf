"""The env protocol around the envs: registry, mixtures, frozen split checksums, the env CLI."""

from __future__ import annotations

import io
import json
import random
from collections import Counter

import pytest

from trainer.envs import MIXTURES, TaskMixture, env_names, make_env, make_mixture
from trainer.envs.cli import bench, expert_episode, play
from trainer.envs.splits import SPLITS_DIR, SplitChecksumError, load_split, write_split


def test_an_unknown_env_is_a_clear_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown environment 'MiniHack-Nope'; known: .*Sokoban-6x6"):
        make_env("MiniHack-Nope")


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="unknown split 'test'"):
        make_env("Sokoban-6x6", "test")


def test_a_tampered_split_file_is_refused(tmp_path):
    path = tmp_path / "Toy.eval.json"
    write_split(path, [{"seed": 1}, {"seed": 2}])
    assert load_split(path) == [{"seed": 1}, {"seed": 2}]
    path.write_text(path.read_text().replace('"seed": 2', '"seed": 3'))
    with pytest.raises(SplitChecksumError, match="does not match its checksum"):
        load_split(path)


def test_every_committed_split_matches_its_checksum():
    files = sorted(SPLITS_DIR.glob("*.eval.json"))
    assert {"MiniHack-KeyRoom-Dark-S5.eval.json", "Sokoban-6x6.eval.json"} <= {f.name for f in files}
    for path in files:
        assert load_split(path) == json.loads(path.read_text())


def test_mixture_sampling_follows_the_weights():
    mixture = TaskMixture({"a": 3.0, "b": 1.0})
    rng = random.Random(0)
    counts = Counter(mixture.sample(rng) for _ in range(4000))
    assert abs(counts["a"] / 4000 - 0.75) < 0.03
    assert set(counts) == {"a", "b"}


def test_a_mixture_needs_positive_weights():
    with pytest.raises(ValueError):
        TaskMixture({"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError):
        TaskMixture({})


def test_mixtures_name_registered_envs_and_single_envs_are_mixtures_of_one():
    names = set(env_names())
    for weights in MIXTURES.values():
        assert set(weights) <= names
    assert set(make_mixture("6-task").names) >= {
        "Sokoban-6x6",
        "MiniHack-KeyRoom-Dark-S5",
        "MiniHack-MazeWalk-9x9",
    }
    assert make_mixture("Sokoban-6x6").weights == {"Sokoban-6x6": 1.0}
    with pytest.raises(ValueError, match="unknown environment or mixture"):
        make_mixture("7-task")


def test_play_reads_actions_from_stdin_until_quit():
    out = io.StringIO()
    assert play("Sokoban-6x6", "eval", 0, stdin=io.StringIO("dance\nup\nquit\n"), stdout=out) is False
    text = out.getvalue()
    assert "Goal: Push both boxes" in text and 'Invalid action: "dance"' in text and text.endswith("Quit.\n")


def test_play_can_finish_an_episode_with_expert_moves():
    out = io.StringIO()
    assert play("Sokoban-6x6", "eval", 1, stdin=io.StringIO("expert\n" * 40), stdout=out)
    assert "Episode over after" in out.getvalue() and "success" in out.getvalue()


def test_expert_episode_prints_every_turn():
    out = io.StringIO()
    assert expert_episode("MiniHack-KeyRoom-Dark-S5", "eval", 0, stdout=out)
    text = out.getvalue()
    assert "--- turn 1: " in text and "apply key" in text and "Episode over after" in text


def test_bench_prints_a_markdown_table():
    out = io.StringIO()
    rows = bench(["Sokoban-6x6", "MiniHack-Room-5x5"], episodes=5, stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("| env | reset ms") and lines[1].startswith("|---")
    assert [r["env"] for r in rows] == ["Sokoban-6x6", "MiniHack-Room-5x5"]
    assert rows[0]["expert"] == "50/50" and rows[0]["random_rate"] is not None
    assert all(r["reset_ms"] > 0 and r["step_ms"] > 0 for r in rows)

"""Sokoban-6x6: generator and solver, expert, random policy, mechanics, parsing, seeds, limits."""

from __future__ import annotations

import random

import pytest

from trainer.envs import make_env
from trainer.envs.sokoban import MAX_MOVES, MIN_MOVES, N_BOXES, SIZE, Level, apply_move, generate, solve
from trainer.envs.splits import load_split, split_path


@pytest.fixture
def env():
    return make_env("Sokoban-6x6", "eval")


def test_generated_levels_are_6x6_with_two_boxes_and_solvable_in_range():
    for seed in range(20):
        level, optimal = generate(seed)
        rows = level.rows()
        assert len(rows) == SIZE and all(len(r) == SIZE for r in rows)
        assert len(level.boxes) == len(level.targets) == N_BOXES
        assert not level.boxes & level.targets
        plan = solve(level, level.player, level.boxes)
        assert plan is not None and len(plan) == optimal and MIN_MOVES <= optimal <= MAX_MOVES


def test_the_frozen_eval_levels_match_their_recorded_optimum():
    instances = load_split(split_path("Sokoban-6x6"))
    assert len(instances) == 200
    assert all(inst["seed"] >= 10**9 for inst in instances)
    for inst in instances[:10]:
        level = Level.from_rows(inst["level"])
        assert level.rows() == inst["level"]
        assert len(solve(level, level.player, level.boxes)) == inst["optimal_moves"]


def test_the_expert_solves_eval_levels(env):
    for seed in range(20):
        env.reset(seed)
        info: dict = {}
        while not env.done:
            _, reward, _, info = env.step(env.expert_action())
        assert info["success"] and reward == 1.0


def test_the_expert_replans_after_the_player_deviates(env):
    env.reset(4)
    rng = random.Random(1)
    for _ in range(3):  # wander off, avoiding pushes that could deadlock
        safe = [
            a
            for a in env.admissible_actions()
            if solve(env.level, *apply_move(env.level, env.player, env.boxes, a)) is not None
        ]
        env.step(rng.choice(safe))
    info: dict = {}
    while not env.done:
        _, _, _, info = env.step(env.expert_action())
    assert info["success"]


def test_a_random_valid_action_policy_rarely_succeeds(env):
    rng = random.Random(0)
    wins = 0
    for seed in range(20):
        _, info = env.reset(seed)
        done = False
        while not done:
            _, _, done, info = env.step(rng.choice(info["admissible_actions"]))
        wins += info["success"]
    assert wins <= 2


def test_pushing_and_blocked_moves():
    env = make_env("Sokoban-6x6", "train")
    env.reset(0)
    env.level = Level.from_rows(["######", "#@$_.#", "#____#", "#_$_.#", "#____#", "######"])
    env.player, env.boxes = env.level.player, env.level.boxes
    assert env.admissible_actions() == ["down", "right"]
    obs, _, _, info = env.step("up")
    assert "cannot move up" in obs and not info["invalid_action"] and env.player == (1, 1)
    obs, _, done, _ = env.step("push right")
    assert "pushed a box" in obs and env.boxes == {(1, 3), (3, 2)} and not done
    obs, reward, done, info = env.step("east")
    assert env.boxes == {(1, 4), (3, 2)} and "Boxes on targets: 1 of 2." in obs and not done
    assert "cannot move right" in env.step("right")[0]  # the box is against the wall


def test_the_same_seed_gives_the_same_level_and_train_differs_from_eval():
    train, evaluation = make_env("Sokoban-6x6", "train"), make_env("Sokoban-6x6", "eval")
    assert train.reset(5)[0] == train.reset(5)[0] != train.reset(6)[0]
    assert evaluation.reset(5)[0] == evaluation.reset(5)[0]
    assert train.reset(0)[0] != evaluation.reset(0)[0]
    assert evaluation.num_instances() == 200 and train.num_instances() is None


def test_an_unparseable_action_is_invalid_and_the_episode_goes_on(env):
    obs0, _ = env.reset(0)
    obs, reward, done, info = env.step("I am not sure")
    assert info["invalid_action"] and not done and reward == 0.0 and obs.startswith("Invalid action")
    assert env.parse_action("I will push the box UP.") == "up"
    assert env.parse_action("go west") == "left"
    assert env.parse_action("upward") is None


def test_the_turn_limit_ends_the_episode(env):
    env.reset(0)
    done, info, turns = False, {}, 0
    while not done:
        _, _, done, info = env.step("nothing")
        turns += 1
    assert turns == env.max_turns and info["truncated"] and not info["success"]


def test_the_observation_has_a_legend_and_relative_positions():
    env = make_env("Sokoban-6x6", "train")
    env.reset(0)
    env.level = Level.from_rows(["######", "#@$_.#", "#____#", "#_$_.#", "#____#", "######"])
    env.player, env.boxes = env.level.player, env.level.boxes
    obs = env.render()
    assert "#@$_.#" in obs and "Legend: # wall" in obs
    assert "- box: 1 right" in obs and "- box: 2 down, 1 right" in obs and "- empty target: 3 right" in obs

"""ALFWorld: generated games on the real engine, expert, random policy, parser, splits, official data,
and the generated games in ALFWorld's own environment class with its own experts."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from trainer.envs import make_env
from trainer.envs.alfworld import ALFWorldEnv, gen, match_command
from trainer.envs.alfworld.original import compare_with_ours, export_games, play_original
from trainer.envs.alfworld.sources import OfficialGames, problem_digest
from trainer.envs.splits import load_split, split_path
from trainer.paths import REPO_ROOT

ONE_OF_EACH_TASK = range(6)  # eval instances cycle through the six task types


@pytest.fixture(scope="module")
def eval_env() -> ALFWorldEnv:
    env = make_env("ALFWorld", "eval")
    yield env
    env.close()


@pytest.fixture(scope="module")
def train_env() -> ALFWorldEnv:
    env = make_env("ALFWorld", "train")
    yield env
    env.close()


def play_expert(env: ALFWorldEnv, seed: int, detour: tuple[str, ...] = ()) -> tuple[dict, float, int]:
    env.reset(seed)
    for action in detour:
        env.step(action)
    reward, info, steps = 0.0, {}, 0
    while not env.done:
        _, reward, _, info = env.step(env.expert_action())
        steps += 1
    return info, reward, steps


# ---- expert and random policy ---------------------------------------------------------------------
def test_the_expert_solves_one_eval_game_of_each_task_type(eval_env):
    split = load_split(split_path("ALFWorld"))
    assert {split[s]["task_type"] for s in ONE_OF_EACH_TASK} == set(gen.TASK_TYPES)
    for seed in ONE_OF_EACH_TASK:
        info, reward, _ = play_expert(eval_env, seed)
        assert info["success"] and reward == ALFWorldEnv.success_reward == 1.0, f"seed {seed}: {info}"


def test_the_expert_replans_after_a_detour(eval_env):
    eval_env.reset(0)
    plan_start = eval_env.expert_action()
    detour = [a for a in eval_env.admissible_actions() if a.startswith("go to ") and a != plan_start][:1]
    info, _, _ = play_expert(eval_env, 0, detour=(*detour, "inventory"))
    assert info["success"]


def test_the_expert_solves_train_games_from_train_floor_plans_only(train_env):
    assert train_env.num_instances() is None  # train games are generated without bound
    for seed in (0, 1):
        _, first = train_env.reset(seed)
        meta = json.loads(Path(first["game_file"]).read_text())["meta"]
        assert meta["floor_plan"] in gen.TRAIN_FLOOR_PLANS
        info, _, _ = play_expert(train_env, seed)
        assert info["success"]


def test_a_random_valid_action_policy_rarely_succeeds(eval_env):
    rng = random.Random(0)
    wins = 0
    for seed in (0, 2, 3):
        eval_env.reset(seed)
        info: dict = {}
        while not eval_env.done:
            _, _, _, info = eval_env.step(rng.choice(eval_env.admissible_actions()))
            assert not info["invalid_action"]
        wins += info["success"]
    assert wins <= 1


# ---- protocol ---------------------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_episode(eval_env):
    first, info = eval_env.reset(1)
    replies = [eval_env.step(a)[0] for a in ("look", info["admissible_actions"][0], "inventory")]
    eval_env.reset(4)
    again, info_again = eval_env.reset(1)
    assert (again, info_again["admissible_actions"]) == (first, info["admissible_actions"])
    assert [eval_env.step(a)[0] for a in ("look", info["admissible_actions"][0], "inventory")] == replies
    other = make_env("ALFWorld", "eval")
    try:
        assert other.reset(1)[0] == first
    finally:
        other.close()


def test_reset_shows_the_room_and_the_task(eval_env):
    obs, info = eval_env.reset(3)
    assert info["goal"] and f"Your task is to: {info['goal']}." in obs
    assert "you see a" in obs and "Welcome to TextWorld" not in obs
    assert any(a.startswith("go to ") for a in info["admissible_actions"])


def test_an_unparseable_action_is_invalid_and_the_episode_goes_on(eval_env):
    eval_env.reset(0)
    obs, reward, done, info = eval_env.step("fly to the moon")
    assert info["invalid_action"] and not done and reward == 0.0
    assert "Invalid action" in obs and info["admissible_actions"]
    _, _, done, info = eval_env.step("take unicorn 3 from fridge 9")  # well-formed, but not possible here
    assert info["invalid_action"] and not done
    _, _, _, info = eval_env.step("I will look around. Action: look")
    assert not info["invalid_action"]


def test_the_turn_limit_ends_the_episode_with_the_failure_reward(eval_env):
    eval_env.max_turns = 3
    try:
        eval_env.reset(0)
        results = [eval_env.step("look") for _ in range(3)]
    finally:
        del eval_env.max_turns
    assert [done for _, _, done, _ in results] == [False, False, True]
    _, reward, _, info = results[-1]
    assert reward == ALFWorldEnv.failure_reward == -1.0 and info["truncated"] and not info["success"]
    with pytest.raises(RuntimeError):
        eval_env.step("look")


def test_the_parser_is_tolerant_of_words_and_strict_about_commands():
    admissible = [
        "go to countertop 1",
        "go to fridge 1",
        "go to drawer 1",
        "go to drawer 2",
        "look",
        "inventory",
    ]
    holding = ["move apple 1 to countertop 1", "examine apple 1", "look", "inventory"]
    assert match_command("go to fridge 1", admissible) == "go to fridge 1"
    assert match_command("I should Go to the Fridge 1.", admissible) == "go to fridge 1"
    assert match_command("Think: the drawer.\nAction: go to drawer 2\nmore", admissible) == "go to drawer 2"
    assert match_command("> look", admissible) == "look"
    assert match_command("go to the fridge", admissible) == "go to fridge 1"  # one fridge: no number needed
    assert match_command("put the apple 1 on countertop 1", holding) == "move apple 1 to countertop 1"
    assert match_command("go to drawer", admissible) is None  # two drawers: no guessing
    assert match_command("go to drawer 3", admissible) is None  # never another drawer than the one said
    assert match_command("dance", admissible) is None


# ---- splits and data ----------------------------------------------------------------------------------
def test_the_frozen_eval_split_regenerates_to_its_checksums_on_unseen_floor_plans():
    split = load_split(split_path("ALFWorld"))
    assert len(split) >= 50 and make_env("ALFWorld", "eval").num_instances() == len(split)
    assert Counter(e["task_type"] for e in split).keys() == set(gen.TASK_TYPES)
    assert {e["floor_plan"] for e in split} <= set(gen.EVAL_FLOOR_PLANS)
    assert not set(gen.EVAL_FLOOR_PLANS) & set(gen.TRAIN_FLOOR_PLANS)
    for entry in split[:3]:
        game = gen.generate_game(entry["floor_plan"], entry["task_type"], entry["gen_seed"])
        assert problem_digest(game) == entry["sha256"] and game["meta"]["goal"] == entry["goal"]


def test_importing_the_envs_does_not_import_alfworld():
    code = "import sys, trainer.envs; assert 'alfworld' not in sys.modules and 'textworld' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


def _official_game(eval_env: ALFWorldEnv, seed: int) -> tuple[dict, dict]:
    """An eval game as the official data stores it: task text not yet in the grammar, traj_data beside."""
    eval_env.reset(seed)
    game = json.loads(Path(eval_env.games.game_file(seed, eval_env.engine)).read_text())
    goal = game["meta"]["goal"]
    game["grammar"] = game["grammar"].replace(goal, "UNKNOWN GOAL")
    traj = {"task_type": game["meta"]["task_type"], "pddl_params": game["meta"]["pddl_params"]}
    return game, traj


def test_official_data_loads_from_its_folder_layout(eval_env, tmp_path, monkeypatch):
    def put(split: str, trial: str, game: dict, traj: dict) -> None:
        folder = tmp_path / "json_2.1.1" / split / trial / "trial_T0"
        folder.mkdir(parents=True)
        (folder / "game.tw-pddl").write_text(json.dumps(game))
        (folder / "traj_data.json").write_text(json.dumps(traj))

    game, traj = _official_game(eval_env, 0)
    put("valid_unseen", "pick_and_place_simple-Pan-None-Fridge-2", game, traj)
    put("valid_unseen", "pick_and_place_with_movable_recep-Pan-Bowl-Fridge-2", game, traj)  # skipped
    put(
        "valid_unseen", "pick_and_place_simple-Pan-None-Fridge-3", game | {"solvable": False}, traj
    )  # skipped
    put("train", "look_at_obj_in_light-Book-None-FloorLamp-202", *_official_game(eval_env, 1))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))

    env = make_env("ALFWorld", "eval")
    try:
        assert isinstance(env.games, OfficialGames) and env.num_instances() == 1
        obs, info = env.reset(0)
        params = traj["pddl_params"]
        assert (
            params["object_target"].lower() in info["goal"]
            and params["parent_target"].lower() in info["goal"]
        )
        assert "UNKNOWN GOAL" not in obs
        info, _, _ = play_expert(env, 0)
        assert info["success"]
    finally:
        env.close()
    train = make_env("ALFWorld", "train")
    assert train.num_instances() == 1 and "floorlamp" in train.reset(0)[1]["goal"]
    train.close()


# ---- ALFWorld's own environment class and experts ----------------------------------------------------
ORIGINAL_SAMPLE = (1, 3, 5)
"""Eval games checked in CI (look, heat, pick-two); ``python -m trainer.envs.alfworld check-original``
checks all of them with both experts."""


def test_eval_games_run_in_alfworlds_own_env_whose_planner_expert_solves_them(eval_env, tmp_path):
    data = export_games(eval_env, ORIGINAL_SAMPLE, tmp_path)
    results = play_original(data, "planner")
    assert [r.index for r in results] == list(ORIGINAL_SAMPLE)
    split = load_split(split_path("ALFWorld"))
    for result in results:
        assert result.won and result.task_type == split[result.index]["task_type"]
        assert result.actions == split[result.index]["walkthrough"]  # the plan frozen with the split
        # Our env shows the same text and the same commands along the same episode.
        assert compare_with_ours(eval_env, result) is None
    result = results[0]
    result.observations[1] = result.observations[1].replace("you see", "you notice")
    assert "after" in compare_with_ours(eval_env, result)

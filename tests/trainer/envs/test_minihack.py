"""MiniHack tasks on the real NetHack engine: expert, random policy, parsing, seeds, limits, rendering,
and the text observation checked against NLE's own observation keys."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from trainer.envs import env_names, make_env
from trainer.envs.minihack import DIRECTIONS, EVAL_SEEDS, TASKS, TRAIN_SEEDS, MiniHackEnv
from trainer.envs.minihack_check import check_env, check_observation
from trainer.envs.splits import load_split, split_path


@pytest.fixture(scope="module")
def envs():
    """One env per (name, split), reused across tests as the training loop would."""
    made: dict[tuple[str, str], MiniHackEnv] = {}

    def get(name: str, split: str = "eval") -> MiniHackEnv:
        if (name, split) not in made:
            made[(name, split)] = make_env(name, split)
        return made[(name, split)]

    yield get
    for env in made.values():
        env.close()


def play_expert(env: MiniHackEnv, seed: int) -> dict:
    env.reset(seed)
    info: dict = {}
    while not env.done:
        _, _, _, info = env.step(env.expert_action())
    return info


def test_every_task_is_registered_with_its_minihack_id():
    names = env_names()
    for task in TASKS:
        assert task.name in names
    assert {t.gym_id for t in TASKS} >= {"MiniHack-Room-Ultimate-15x15-v0", "MiniHack-KeyRoom-Dark-S5-v0"}
    assert len(TASKS) == 14


@pytest.mark.parametrize(
    "name",
    [
        "MiniHack-Room-5x5",
        "MiniHack-Room-Dark-15x15",
        "MiniHack-Room-Trap-15x15",
        "MiniHack-Room-Ultimate-15x15",
        "MiniHack-MazeWalk-9x9",
        "MiniHack-KeyRoom-Dark-S5",
    ],
)
def test_the_expert_solves_eval_levels(envs, name):
    env = envs(name)
    results = [play_expert(env, seed) for seed in range(6)]
    assert all(info["success"] for info in results)
    assert all(info["turn"] <= env.max_turns for info in results)


def test_the_keyroom_expert_picks_up_the_key_and_unlocks_the_door(envs):
    env = envs("MiniHack-KeyRoom-Dark-S5")
    env.reset(1)
    actions = []
    while not env.done:
        actions.append(env.expert_action())
        env.step(actions[-1])
    assert "pick up" in actions and "apply key" in actions
    assert actions.index("pick up") < actions.index("apply key")


def test_a_random_valid_action_policy_rarely_succeeds(envs):
    env = envs("MiniHack-Room-15x15")
    rng = random.Random(0)
    wins = 0
    for seed in range(8):
        _, info = env.reset(seed)
        done = False
        while not done:
            _, _, done, info = env.step(rng.choice(info["admissible_actions"]))
        wins += info["success"]
    assert wins <= 1


def test_the_same_seed_gives_the_same_episode(envs):
    env = envs("MiniHack-Room-Monster-15x15", "train")
    runs = []
    for _ in range(2):
        obs, _ = env.reset(7)
        trace = [obs]
        for action in ["north", "east", "southwest", "south", "west", "northeast"]:
            obs, _, done, _ = env.step(action)
            trace.append(obs)
            if done:
                break
        runs.append(trace)
    assert runs[0] == runs[1]
    assert env.reset(8)[0] != runs[0][0]


def test_train_and_eval_draw_levels_from_disjoint_seed_ranges(envs):
    train, evaluation = envs("MiniHack-Room-Random-5x5", "train"), envs("MiniHack-Room-Random-5x5", "eval")
    assert all(train.level_seed(s) in TRAIN_SEEDS for s in (0, 5, 10**9 + 3))
    assert all(evaluation.level_seed(s) in EVAL_SEEDS for s in range(evaluation.num_instances()))
    assert evaluation.num_instances() == 100


def test_the_frozen_eval_split_still_produces_the_recorded_levels(envs):
    """Guards against an NLE/MiniHack upgrade silently changing the eval levels."""
    for name in ("MiniHack-Room-Ultimate-15x15", "MiniHack-MazeWalk-9x9"):
        env = envs(name)
        instances = load_split(split_path(name))
        for seed in range(3):
            env.reset(seed)
            assert list(env._agent()) == instances[seed]["start"]


def test_an_unparseable_action_is_invalid_and_the_episode_goes_on(envs):
    env = envs("MiniHack-Room-5x5")
    env.reset(0)
    obs, reward, done, info = env.step("let me think about it")
    assert info["invalid_action"] and not done and reward == 0.0
    assert obs.startswith('Invalid action: "let me think about it"')
    assert "north" in obs and env.turn == 1
    _, _, _, info = env.step("I will move east.")
    assert not info["invalid_action"]


def test_parse_action_is_tolerant_of_words_and_strict_about_actions(envs):
    room, keyroom = envs("MiniHack-Room-5x5"), envs("MiniHack-KeyRoom-Dark-S5")
    assert room.parse_action("I will move north.") == "north"
    assert room.parse_action("Action: north-east") == "northeast"
    assert room.parse_action("go South West now") == "southwest"
    assert room.parse_action("NW") == "northwest"
    assert room.parse_action("pick up the key") is None  # not an action of Room
    assert room.parse_action("northward ho") is None
    assert keyroom.parse_action("I pick up the key") == "pick up"
    assert keyroom.parse_action("apply the key to the door") == "apply key"


def test_the_turn_limit_ends_the_episode(envs):
    env = envs("MiniHack-Room-5x5")
    env.reset(0)  # the agent starts in the north-west corner: going west does nothing
    done, turns = False, 0
    while not done:
        obs, reward, done, info = env.step("west")
        turns += 1
    assert turns == env.max_turns and reward == 0.0 and not info["success"]
    assert info["truncated"] and "Turn limit" in obs
    with pytest.raises(RuntimeError):
        env.step("east")


def test_the_observation_has_map_message_and_a_legend_with_relative_positions(envs):
    env = envs("MiniHack-Room-Random-15x15", "train")
    obs, info = env.reset(3)
    assert obs.startswith("Goal: ") and info["goal"]
    chars = env._obs["chars"]
    (sy,), (sx,) = np.nonzero(chars == ord(">"))
    ax, ay = env._agent()
    dx, dy = int(sx) - ax, int(sy) - ay
    parts = [f"{abs(dx)} {'east' if dx > 0 else 'west'}"] if dx else []
    parts += [f"{abs(dy)} {'south' if dy > 0 else 'north'}"] if dy else []
    direction = {move: name for name, move in DIRECTIONS.items()}[(int(np.sign(dx)), int(np.sign(dy)))]
    assert f"- staircase down (>): {direction} ({', '.join(parts)})" in obs
    assert "Message: " in obs and "Map (you are @" in obs and "Next to you: north " in obs


def test_admissible_actions_leave_out_solid_stone(envs):
    env = envs("MiniHack-Room-5x5")
    _, info = env.reset(0)  # north-west corner of the room
    assert set(info["admissible_actions"]) == {"east", "south", "southeast"}


def test_the_expert_map_matches_the_real_level(envs):
    """The shadow level (lit, premapped) puts the stairs where the lit game shows them."""
    env = envs("MiniHack-Room-Random-15x15", "train")
    for seed in range(4):
        env.reset(seed)
        (sy,), (sx,) = np.nonzero(env._obs["chars"] == ord(">"))
        level = env._reveal_level()
        assert [p for p, d in level.items() if "staircase down" in d] == [(int(sx), int(sy))]


def test_train_keyrooms_without_a_key_are_skipped(envs):
    """About 13% of MiniHack's KeyRoom-Dark-S5 levels have no key; reset moves past them."""
    env = envs("MiniHack-KeyRoom-Dark-S5", "train")
    keyless = []
    for seed in range(40):
        env._start(seed)
        if not env.solvable():
            keyless.append(seed)
    assert keyless, "expected some keyless levels among 40"
    env.reset(keyless[0])
    assert env.solvable() and env._level_seed > keyless[0]


# ---- the text observation against NLE's observation keys ------------------------------------------
CHECKED_STATES = 200
"""Per task in CI; ``python -m trainer.envs.minihack_check`` checks 1000 per task."""


@pytest.mark.parametrize("name", [t.name for t in TASKS])
def test_the_text_observation_agrees_with_nle_on_random_states(name):
    """Map = NLE's chars around blstats' agent, legend = screen_descriptions at the stated offsets."""
    report = check_env(name, CHECKED_STATES)
    assert report.states == CHECKED_STATES and report.legend_lines > 0
    assert report.problems == []


def test_the_check_catches_a_shifted_map_a_wrong_legend_and_wrong_neighbours(envs):
    env = envs("MiniHack-Room-Random-15x15", "train")
    env.reset(3)
    text = env.render()
    assert check_observation(text, env._obs) == []
    lines = text.split("\n")
    map_start = lines.index("Map (you are @; north is up):") + 1
    legend = next(i for i, ln in enumerate(lines) if ln.startswith("- staircase down"))
    wrong = {
        "a map row dropped": lines[: map_start + 1] + lines[map_start + 2 :],
        "a legend line one cell off": [
            re.sub(r"\((\d+)", lambda m: f"({int(m.group(1)) + 1}", ln) if i == legend else ln
            for i, ln in enumerate(lines)
        ],
        "a legend symbol wrong": [ln.replace("(>)", "(<)") for ln in lines],
        "the neighbours turned": [ln.replace("Next to you: north", "Next to you: south", 1) for ln in lines],
    }
    for why, changed in wrong.items():
        assert "\n".join(changed) != text, why
        assert check_observation("\n".join(changed), env._obs), why

"""The generated games in ALFWorld's own environment class, solved by ALFWorld's own experts.

ALFWorld's scripts load games through ``AlfredTWEnv(config, train_eval).init_env(batch_size)``
(``alfworld.agents.environment.alfred_tw_env``): it collects every solvable ``game.tw-pddl`` with a
``traj_data.json`` beside it under the configured data path and registers them as one TextWorld gym
env, wrapped in ``AlfredDemangler``, ``AlfredInfos`` and, for training, ``AlfredExpert``, whose
``infos["extra.expert_plan"]`` is the next step of the PDDL planner (``planner``) or of the
handcoded expert (``handcoded``, which reads the task's ``pddl_params`` from ``traj_data.json``; it
picks a random command when it would repeat itself, in the env's own forked process, so its figure
varies a little from run to run; the planner's does not).

``export_games`` writes the eval split's games in the official folder layout; ``play_original``
loads them with ``AlfredTWEnv`` unchanged (its ``train`` mode, the one that adds the expert) and
plays the expert's plan with ALFWorld's step limit of 50; ``compare_with_ours`` replays the same
actions through ``ALFWorldEnv`` and reports the first observation or command list that differs.

    python -m trainer.envs.alfworld check-original                  # every eval game, both experts
    python -m trainer.envs.alfworld check-original --count 6 --expert planner
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.envs.alfworld.engine import import_alfworld
from trainer.envs.alfworld.env import ALFWorldEnv

MAX_STEPS = 50
"""ALFWorld's ``max_nb_steps_per_episode`` for evaluation (``configs/base_config.yaml``), as ours."""
EXPERTS = ("planner", "handcoded")
_TRIAL = re.compile(r"trial_(\d+)$")


@dataclass
class GameResult:
    index: int
    task_type: str
    won: bool
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    admissible: list[list[str]] = field(default_factory=list)
    """What ALFWorld showed before each action (and after the last one)."""


def export_games(env: ALFWorldEnv, indices: Iterable[int], root: Path) -> Path:
    """Write eval games ``indices`` of ``env`` as ALFWorld's data folder does; returns the data path.

    Each game gets ``<task_type>-<object>-<movable>-<receptacle>-<floor plan>/trial_<index>/`` with
    its ``game.tw-pddl`` and the ``traj_data.json`` fields ALFWorld reads (task type, PDDL params).
    """
    data = root / "json_2.1.1" / "valid_unseen"
    for index in indices:
        game = json.loads(env.games.game_file(index, env.engine).read_text())
        meta, params = game["meta"], game["meta"]["pddl_params"]
        target = params["parent_target"] or params["toggle_target"]
        task = f"{meta['task_type']}-{params['object_target']}-None-{target}-{meta['floor_plan']}"
        folder = data / task / f"trial_{index:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "game.tw-pddl").write_text(json.dumps(game))
        traj = {
            "task_type": meta["task_type"],
            "pddl_params": params,
            "scene": {"floor_plan": meta["floor_plan"]},
        }
        (folder / "traj_data.json").write_text(json.dumps(traj))
    return data


def alfworld_config(data_path: Path, expert: str) -> dict[str, Any]:
    """The parts of ALFWorld's ``base_config.yaml`` that ``AlfredTWEnv`` reads, for DAgger evaluation."""
    return {
        "env": {
            "goal_desc_human_anns_prob": 0.0,
            "task_types": [1, 2, 3, 4, 5, 6],
            "domain_randomization": False,
            "expert_type": expert,
        },
        "dataset": {"data_path": str(data_path), "num_train_games": -1},
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": MAX_STEPS}},
    }


def play_original(data_path: Path, expert: str) -> list[GameResult]:
    """Every game under ``data_path``, loaded by ``AlfredTWEnv`` and played by ``expert``'s plan."""
    import_alfworld()
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv  # heavy and optional: only when played

    # "train" is only the mode in which AlfredTWEnv adds AlfredExpert; the games are the eval split's.
    tw_env = AlfredTWEnv(alfworld_config(data_path, expert), train_eval="train")
    gym_env = tw_env.init_env(batch_size=1) if expert == "handcoded" else _planner_env(tw_env.game_files)
    results = []
    try:
        for _ in range(tw_env.num_games):
            obs, infos = gym_env.reset()
            folder = Path(infos["extra.gamefile"][0]).parent
            traj = json.loads((folder / "traj_data.json").read_text())
            result = GameResult(int(_TRIAL.search(folder.name).group(1)), traj["task_type"], False)
            done = False
            while not done:
                result.observations.append(obs[0])
                result.admissible.append(list(infos["admissible_commands"][0]))
                action = infos["extra.expert_plan"][0][0]
                obs, _, dones, infos = gym_env.step([action])
                result.actions.append(action)
                done = dones[0]
            result.observations.append(obs[0])
            result.admissible.append(list(infos["admissible_commands"][0]))
            result.won = bool(infos["won"][0])
            results.append(result)
    finally:
        gym_env.close()
    return sorted(results, key=lambda r: r.index)


def _planner_env(game_files: list[str]) -> Any:
    """``init_env``'s gym env with the planner expert, wrapped as ``alfworld-play-tw`` wraps it.

    ``init_env`` itself cannot give it: it calls ``AlfredExpert(expert_type)``, which passes the type
    as the wrapper's ``env`` argument and leaves ``expert_type`` at its default, ``handcoded`` (alfworld
    0.4.2 and the authors' master alike). Everything else here is what ``init_env`` does.
    """
    # alfworld and textworld: heavy and optional, imported only when the original env is played
    import textworld
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

    request_infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile", "expert_plan"])
    env_id = textworld.gym.register_games(
        game_files,
        request_infos,
        batch_size=1,
        asynchronous=True,
        max_episode_steps=MAX_STEPS,
        wrappers=[AlfredDemangler(shuffle=False), AlfredInfos, AlfredExpert(expert_type="planner")],
    )
    return textworld.gym.make(env_id)


def compare_with_ours(env: ALFWorldEnv, result: GameResult) -> str | None:
    """Replay ``result``'s actions in ``env``: the first difference from ALFWorld's own env, or None."""
    obs, info = env.reset(result.index)
    theirs = result.observations[0].split("-= Welcome to TextWorld, ALFRED! =-", 1)[-1].strip()
    if obs != theirs:
        return f"game {result.index}, reset: {obs!r} != ALFWorld's {theirs!r}"
    admissible = info["admissible_actions"]
    for step, action in enumerate(result.actions):
        if sorted(admissible) != sorted(result.admissible[step]):
            return f"game {result.index}, step {step}: admissible commands differ"
        obs, _, done, info = env.step(action)
        if obs.split("\nTurn limit of")[0] != result.observations[step + 1]:
            return f"game {result.index}, after {action!r}: {obs!r} != {result.observations[step + 1]!r}"
        admissible = info["admissible_actions"]
    if info["success"] != result.won:
        return f"game {result.index}: ours says success={info['success']}, ALFWorld won={result.won}"
    return None


def check_original(
    count: int | None = None, experts: Sequence[str] = EXPERTS, log: Callable[[str], None] = print
) -> bool:
    """The first ``count`` eval games (all by default) in ``AlfredTWEnv``, played by each expert; the
    planner's episodes also replayed through our env. True when the planner solves every game, its
    plans are the frozen walkthroughs and our env shows what ALFWorld's shows."""
    env = ALFWorldEnv("eval")
    total = env.num_instances() or 0
    indices = range(min(count or total, total))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = export_games(env, indices, Path(tmp))
            return all([_check_expert(env, data, expert, len(indices), log) for expert in experts])
    finally:
        env.close()


def _check_expert(env: ALFWorldEnv, data: Path, expert: str, games: int, log: Callable[[str], None]) -> bool:
    start = time.perf_counter()
    results = play_original(data, expert)
    won = [r for r in results if r.won]
    lost = [r.index for r in results if not r.won]
    steps = statistics.mean(len(r.actions) for r in won) if won else 0.0
    log(
        f"ALFWorld's {expert} expert in AlfredTWEnv: {len(won)}/{len(results)} eval games solved, mean "
        f"{steps:.1f} steps ({time.perf_counter() - start:.0f} s); solved by task type "
        f"{dict(Counter(r.task_type for r in won))}" + (f"; not solved: {lost}" if lost else "")
    )
    if expert != "planner":
        return len(results) == games
    assert env.games.instances is not None  # generated eval games: the walkthroughs are frozen
    same = sum(r.actions == env.games.instances[r.index]["walkthrough"] for r in results)
    log(f"planner episodes identical to the walkthroughs frozen with the split: {same}/{len(results)}")
    differences = [d for d in (compare_with_ours(env, r) for r in results) if d]
    log(f"our env replaying those episodes: {len(results) - len(differences)}/{len(results)} identical")
    for difference in differences[:5]:
        log(f"    {difference}")
    return len(results) == games and not lost and not differences

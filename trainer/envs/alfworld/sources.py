"""Where an ALFWorld env gets its games: generated here (the default) or the official data.

Generated games: train and eval use disjoint floor plans (ALFRED's seen/unseen scenes, see
``gen.EVAL_FLOOR_PLANS``). Instance ``seed`` of the train split is generated on first use from the
train floor plans, kept only if the planner expert solves it, and cached under
``var/cache/alfworld/games``. The eval split is frozen in ``trainer/envs/splits/ALFWorld.eval.json``:
each entry holds the generation parameters, the sha256 of the generated PDDL problem and the
planner's walkthrough, so the games are rebuilt identically (and checked) on any machine.

Official games: when ``$ALFWORLD_DATA/json_2.1.1/{train,valid_unseen}`` exists, train plays the
official ``train`` games and eval the ``valid_unseen`` ones (unseen floor plans too).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

from trainer.envs.alfworld import gen
from trainer.envs.alfworld.engine import Engine, GameNotSolvable
from trainer.envs.splits import SplitChecksumError, load_split, split_path, write_split
from trainer.paths import cache_dir

ENV_NAME = "ALFWorld"
GENERATOR_VERSION = "v1"
"""Part of the cache path: bump it when ``gen.py`` changes what it writes for a given seed."""
MAX_ATTEMPTS = 20
OFFICIAL_SPLITS = {"train": "train", "eval": "valid_unseen"}


def problem_digest(game: dict[str, Any]) -> str:
    return hashlib.sha256(game["pddl_problem"].encode()).hexdigest()


def games_dir(*parts: str) -> Path:
    return cache_dir("alfworld", "games", GENERATOR_VERSION, *parts)


def _floor_plans(split: str, task_type: str) -> list[int]:
    plans = gen.EVAL_FLOOR_PLANS if split == "eval" else gen.TRAIN_FLOOR_PLANS
    return [n for n in plans if gen.possible_tasks(n, task_type)]


def solve_generated(
    split: str, index: int, engine: Engine, verify: bool = False
) -> tuple[dict[str, Any], Path] | None:
    """Generate instance ``index`` of ``split``: the first attempt whose game the planner solves.

    Returns the game (with ``solvable``, ``walkthrough`` and generation time filled in) and its
    file, which ``engine`` has loaded. With ``verify`` the walkthrough is also played to the win.
    """
    task_type = gen.TASK_TYPES[index % len(gen.TASK_TYPES)]
    plans = _floor_plans(split, task_type)
    for attempt in range(MAX_ATTEMPTS):
        start = time.perf_counter()
        number = random.Random(f"{split}:{index}:{attempt}").choice(plans)
        game = gen.generate_game(number, task_type, gen_seed=f"{split}-{index}-{attempt}")
        assert game is not None  # the floor plan was chosen among those that host task_type
        path = games_dir(split, "pending") / f"{index:06d}-{attempt}-{os.getpid()}.tw-pddl"
        gen.write_game(path, game)
        try:
            engine.load(path)
            engine.reset()
            plan = engine.expert_plan()
        except GameNotSolvable:
            plan = []
        if plan and verify:
            plan = plan if _plays_to_win(engine, plan) else []
        if plan:
            game["solvable"], game["walkthrough"] = True, plan
            game["meta"]["generation_s"] = round(time.perf_counter() - start, 3)
            return game, path
        path.unlink()
    return None


def _plays_to_win(engine: Engine, plan: list[str]) -> bool:
    engine.reset()
    won = False
    for command in plan:
        _, _, won = engine.step(command)
    return won


class GeneratedGames:
    """Games generated from the shipped floor plans (see the module docstring)."""

    def __init__(self, split: str) -> None:
        self.split = split
        self.instances: list[dict[str, Any]] | None = None
        if split == "eval":
            self.instances = load_split(split_path(ENV_NAME))

    def num_instances(self) -> int | None:
        """The size of the frozen eval split; None for train, which generates without bound."""
        return None if self.instances is None else len(self.instances)

    def game_file(self, seed: int, engine: Engine) -> Path:
        if self.instances is not None:
            return self._eval_file(seed)
        path = games_dir(self.split) / f"{seed:06d}.tw-pddl"
        if not path.exists():
            solved = solve_generated(self.split, seed, engine)
            if solved is None:
                raise RuntimeError(
                    f"ALFWorld: no solvable game for {self.split} seed {seed} in {MAX_ATTEMPTS} tries"
                )
            gen.write_game(path, solved[0])
            solved[1].unlink(missing_ok=True)
        return path

    def _eval_file(self, seed: int) -> Path:
        assert self.instances is not None
        entry = self.instances[seed % len(self.instances)]
        path = games_dir("eval") / f"{seed % len(self.instances):04d}-{entry['sha256'][:12]}.tw-pddl"
        if not path.exists():
            game = gen.generate_game(entry["floor_plan"], entry["task_type"], entry["gen_seed"])
            if game is None or problem_digest(game) != entry["sha256"]:
                raise SplitChecksumError(
                    f"ALFWorld eval game {seed} does not regenerate to its frozen checksum: the installed "
                    "alfworld package or trainer/envs/alfworld/gen.py changed. Install alfworld==0.4.2."
                )
            game["solvable"], game["walkthrough"] = True, entry["walkthrough"]
            gen.write_game(path, game)
        return path


class OfficialGames:
    """The official ALFWorld games under ``root/json_2.1.1/<split>/**/game.tw-pddl``."""

    def __init__(self, root: Path, split: str) -> None:
        folder = root / "json_2.1.1" / OFFICIAL_SPLITS[split]
        self.files = [p for p in sorted(folder.rglob("game.tw-pddl")) if self._playable(p, folder)]
        if not self.files:
            raise FileNotFoundError(f"no solvable ALFWorld game.tw-pddl files under {folder}")
        self.root = root

    @staticmethod
    def _playable(path: Path, folder: Path) -> bool:
        rel = str(path.relative_to(folder))
        if "movable" in rel or "Sliced" in rel:  # as ALFWorld's own loader skips them
            return False
        return bool(json.loads(path.read_text()).get("solvable"))

    def num_instances(self) -> int:
        return len(self.files)

    def game_file(self, seed: int, engine: Engine) -> Path:
        path = self.files[seed % len(self.files)]
        game = json.loads(path.read_text())
        if "UNKNOWN GOAL" not in game["grammar"]:
            return path
        # A game whose task text was not written in yet: fill in a templated one, as alfworld-generate does.
        traj = json.loads((path.parent / "traj_data.json").read_text())
        params = traj["pddl_params"]
        task = gen.Task(
            traj["task_type"], params["object_target"], params["parent_target"], params["toggle_target"]
        )
        rel = str(path.relative_to(self.root))
        game["grammar"] = game["grammar"].replace("UNKNOWN GOAL", task.text(random.Random(rel)))
        out = cache_dir("alfworld", "official") / (hashlib.sha256(rel.encode()).hexdigest()[:16] + ".tw-pddl")
        if not out.exists():
            gen.write_game(out, game)
        return out


def official_root() -> Path | None:
    """``$ALFWORLD_DATA`` when it holds the official folder layout."""
    root = os.environ.get("ALFWORLD_DATA")
    if root and (Path(root) / "json_2.1.1").is_dir():
        return Path(root)
    return None


def freeze_eval_split(count: int, engine: Engine, log: Any = print) -> Path:
    """Generate ``count`` eval games (task types in turn), verify each, and freeze the split file."""
    entries = []
    for index in range(count):
        solved = solve_generated("eval", index, engine, verify=True)
        if solved is None:
            raise RuntimeError(f"no solvable eval game for index {index}")
        game, path = solved
        path.unlink(missing_ok=True)
        meta = game["meta"]
        entries.append(
            {
                "floor_plan": meta["floor_plan"],
                "task_type": meta["task_type"],
                "gen_seed": meta["gen_seed"],
                "goal": meta["goal"],
                "sha256": problem_digest(game),
                "walkthrough": game["walkthrough"],
            }
        )
        log(
            f"eval {index}: FloorPlan{meta['floor_plan']} {meta['task_type']} '{meta['goal']}' "
            f"{len(game['walkthrough'])} steps, {meta['generation_s']:.1f} s"
        )
    path = split_path(ENV_NAME)
    write_split(path, entries)
    return path

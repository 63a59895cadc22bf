"""Dark rooms that come back: a task where only past episodes know the way (the positive control of
docs/experiments/dark-pool/README.md).

``MiniHack-Room-Dark-5x5-Pool`` is MiniHack's ``Room-Dark-5x5`` (you see only the squares next to you)
played over one frozen pool of 16 levels, for training and for evaluation alike: training samples a room of
the pool, the eval split is the pool. Each room has a name, which the goal states ("This is the amber
room."), so a lesson about one room ("in the amber room the stairs are 3 east, 2 south of the start") is
retrieved the next time that room comes back and turns a search in the dark into a walk. No room of the pool
has its stairs in view from the start.

The pool is committed like the eval splits (``splits/MiniHack-Room-Dark-5x5-Pool.pool.json`` beside its
checksum). ``oracle_entries`` writes, for each room, the entry that is true of it: where the stairs lie from
the start and the privileged expert's shortest way there, in the bank's JSONL export format, so a frozen
oracle bank reaches the actor through the normal retrieval path (``frozen_bank``, method static_online).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from itertools import groupby
from pathlib import Path
from typing import Any

from trainer.envs.base import StepInfo, make_env
from trainer.envs.minihack import _VARIANT_GOALS, EVAL_SEEDS, MiniHackEnv, MiniHackTask, _register
from trainer.envs.splits import SPLITS_DIR, load_split, write_split

POOL_ENV = "MiniHack-Room-Dark-5x5-Pool"
ROOM_NAMES = (
    "amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor",
    "indigo", "juniper", "kestrel", "lagoon", "marble", "nectar", "orchid", "pebble",
)  # fmt: skip
"""One distinct word per room of the pool: what the goal names and the oracle's entry repeats."""
EXPORT_FORMAT = "complementary-rl-experience/1"


@dataclass(frozen=True)
class PoolRoom:
    name: str
    level_seed: int
    start: tuple[int, int]
    stairs: tuple[int, int]

    @property
    def offset(self) -> tuple[int, int]:
        """Where the stairs lie from the start: (east, south)."""
        return self.stairs[0] - self.start[0], self.stairs[1] - self.start[1]


def pool_path(env_name: str = POOL_ENV) -> Path:
    return SPLITS_DIR / f"{env_name}.pool.json"


@cache
def load_pool(env_name: str = POOL_ENV) -> tuple[PoolRoom, ...]:
    """The frozen pool, its checksum verified."""
    return tuple(
        PoolRoom(r["name"], r["level_seed"], tuple(r["start"]), tuple(r["stairs"]))
        for r in load_split(pool_path(env_name))
    )


class PoolEnv(MiniHackEnv):
    """A MiniHack room task over a frozen pool: episode seed ``s`` plays room ``s mod len(pool)`` in both
    splits, and the goal names the room."""

    def room(self, seed: int) -> PoolRoom:
        rooms = load_pool(self.name)
        return rooms[seed % len(rooms)]

    def num_instances(self) -> int | None:
        return len(load_pool(self.name)) if self.split == "eval" else None

    def level_seed(self, seed: int) -> int:
        return self.room(seed).level_seed

    def _reset(self, seed: int) -> tuple[str, StepInfo]:
        room = self.room(seed)
        self._start(room.level_seed)
        goal = f"{self.task.goal} This is the {room.name} room."
        return f"Goal: {goal}\n{self.render()}", StepInfo(
            goal=goal, admissible_actions=self.admissible_actions()
        )


POOL_TASK = MiniHackTask(
    name=POOL_ENV,
    gym_id="MiniHack-Room-Dark-5x5-v0",
    max_turns=15,
    goal=_VARIANT_GOALS["Dark"] + " The same few rooms come back, each under its own name.",
)
_register(POOL_TASK, PoolEnv)


def _stairs(env: MiniHackEnv) -> tuple[int, int]:
    level = env._reveal_level()
    return next(p for p, d in level.items() if "staircase down" in d)


def write_pool(size: int = len(ROOM_NAMES), env_name: str = POOL_ENV) -> str:
    """Draw and freeze the pool (done once; the files are committed); returns the checksum.

    Levels are drawn from the eval seed range and kept only when the stairs are out of sight from the
    start (more than one square away), so that every room needs either a search or a memory.
    ``python -c "from trainer.envs.minihack_pool import write_pool; write_pool()"``
    """
    rng = random.Random(f"{env_name}/pool")
    env = make_env("MiniHack-Room-Dark-5x5")  # the same levels without the pool
    rooms: list[dict[str, Any]] = []
    try:
        while len(rooms) < size:
            env._start(rng.randrange(EVAL_SEEDS.start, EVAL_SEEDS.stop))
            start, stairs = env._agent(), _stairs(env)
            if max(abs(stairs[0] - start[0]), abs(stairs[1] - start[1])) > 1:
                name = ROOM_NAMES[len(rooms)]
                rooms.append({"name": name, "level_seed": env._level_seed, "start": start, "stairs": stairs})
    finally:
        env.close()
    load_pool.cache_clear()
    return write_split(pool_path(env_name), rooms)


def shortest_way(room: PoolRoom, env_name: str = POOL_ENV) -> list[str]:
    """The privileged expert's moves from the room's start to its stairs."""
    env = make_env(env_name, split="eval")
    try:
        return env.expert(load_pool(env_name).index(room))
    finally:
        env.close()


def describe_way(moves: list[str]) -> str:
    """'southeast 2 times, then east' for the moves [southeast, southeast, east]."""
    runs = [(move, len(list(group))) for move, group in groupby(moves)]
    return ", then ".join(move if n == 1 else f"{move} {n} times" for move, n in runs)


def oracle_entry(room: PoolRoom, moves: list[str], env_name: str = POOL_ENV) -> dict[str, Any]:
    """The entry that is true of ``room``, as one line of a bank export."""
    east, south = room.offset
    where = ", ".join(
        part
        for part in (
            f"{abs(east)} {'east' if east > 0 else 'west'}" if east else "",
            f"{abs(south)} {'south' if south > 0 else 'north'}" if south else "",
        )
        if part
    )
    return {
        "format": EXPORT_FORMAT,
        "scope": env_name,
        "title": f"The {room.name} room: the way to the stairs",
        "content": (
            f"In the {room.name} room the staircase down (>) is {where} of where you start, out of sight in "
            f"the dark. From the start, move {describe_way(moves)} ({len(moves)} moves in all).\n"
            f"Your answers from the start, one a turn: {', '.join(moves)}."
        ),
        "pinned": True,
    }


def oracle_entries(env_name: str = POOL_ENV) -> list[dict[str, Any]]:
    """One true entry per room of the pool, in pool order."""
    return [oracle_entry(room, shortest_way(room, env_name), env_name) for room in load_pool(env_name)]


def write_oracle_bank(path: Path, env_name: str = POOL_ENV) -> int:
    """The oracle bank as a JSONL export file (what an experiment variant's ``bank`` names)."""
    entries = oracle_entries(env_name)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return len(entries)

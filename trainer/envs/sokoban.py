"""Sokoban-6x6: push two boxes onto two targets in a 6x6 room (walls included), our own generator.

A level is drawn from a seeded generator (random inner walls, targets, boxes and player in the 4x4
interior) and kept only if a breadth-first solver over (player, boxes) states solves it in
``MIN_MOVES``..``MAX_MOVES`` moves. Train levels come from generator seeds in ``[0, 10^9)``; the eval
split is a frozen list of levels (the grids themselves, with their seeds and optimal move counts)
generated from seeds in ``[10^9, 2*10^9)``. The expert replays the solver's plan, re-solving from the
current state whenever the player has deviated from it.
"""

from __future__ import annotations

import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from trainer.envs.base import StepInfo, TextEnv, register_env
from trainer.envs.splits import load_split, split_path, write_split

SIZE = 6
N_BOXES = 2
MIN_MOVES, MAX_MOVES = 6, 24
TRAIN_SEEDS = range(0, 10**9)
EVAL_SEEDS = range(10**9, 2 * 10**9)
EVAL_SIZE = 200

# (d_row, d_col); north is up.
MOVES: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_SYNONYMS = {"north": "up", "south": "down", "west": "left", "east": "right"}
_ACTION_RE = re.compile(r"\b(up|down|left|right|north|south|east|west)\b")

Pos = tuple[int, int]


@dataclass(frozen=True)
class Level:
    walls: frozenset[Pos]
    targets: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos

    def rows(self) -> list[str]:
        """The level as text: # wall, _ floor, . target, $ box, * box on target, @ player, + both."""
        return [render_row(self, r, self.player, self.boxes) for r in range(SIZE)]

    @classmethod
    def from_rows(cls, rows: list[str]) -> Level:
        cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
        player = next(p for p, ch in cells.items() if ch in "@+")
        return cls(
            walls=frozenset(p for p, ch in cells.items() if ch == "#"),
            targets=frozenset(p for p, ch in cells.items() if ch in ".*+"),
            boxes=frozenset(p for p, ch in cells.items() if ch in "$*"),
            player=player,
        )


def render_row(level: Level, r: int, player: Pos, boxes: frozenset[Pos]) -> str:
    out = []
    for c in range(SIZE):
        p = (r, c)
        if p in level.walls:
            out.append("#")
        elif p == player:
            out.append("+" if p in level.targets else "@")
        elif p in boxes:
            out.append("*" if p in level.targets else "$")
        else:
            out.append("." if p in level.targets else "_")
    return "".join(out)


def apply_move(
    level: Level, player: Pos, boxes: frozenset[Pos], move: str
) -> tuple[Pos, frozenset[Pos]] | None:
    """The state after ``move``, or None when it is blocked (a wall, or a box that cannot be pushed)."""
    dr, dc = MOVES[move]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in level.walls:
        return None
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in level.walls or beyond in boxes:
            return None
        return nxt, (boxes - {nxt}) | {beyond}
    return nxt, boxes


def solve(level: Level, player: Pos, boxes: frozenset[Pos], max_moves: int = 60) -> list[str] | None:
    """Shortest move sequence that puts every box on a target (breadth-first over player and boxes)."""
    start = (player, boxes)
    parent: dict[tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str] | None] = {start: None}
    queue = deque([(start, 0)])
    while queue:
        state, depth = queue.popleft()
        if state[1] == level.targets:
            plan = []
            while parent[state] is not None:
                state, move = parent[state]  # type: ignore[misc]
                plan.append(move)
            return plan[::-1]
        if depth >= max_moves:
            continue
        for move in MOVES:
            nxt = apply_move(level, state[0], state[1], move)
            if nxt is not None and nxt not in parent and not _dead(level, nxt[1]):
                parent[nxt] = (state, move)
                queue.append((nxt, depth + 1))
    return None


def _dead(level: Level, boxes: frozenset[Pos]) -> bool:
    """A box off target in a corner can never move again."""
    for r, c in boxes - level.targets:
        vertical = (r - 1, c) in level.walls or (r + 1, c) in level.walls
        horizontal = (r, c - 1) in level.walls or (r, c + 1) in level.walls
        if vertical and horizontal:
            return True
    return False


def generate(seed: int) -> tuple[Level, int]:
    """A solvable level from generator seed ``seed`` and its optimal number of moves."""
    rng = random.Random(seed)
    border = {(r, c) for r in range(SIZE) for c in range(SIZE) if r in (0, SIZE - 1) or c in (0, SIZE - 1)}
    interior = [(r, c) for r in range(1, SIZE - 1) for c in range(1, SIZE - 1)]
    while True:
        cells = interior[:]
        rng.shuffle(cells)
        n_walls = rng.randint(0, 2)
        walls = frozenset(border | set(cells[:n_walls]))
        free = cells[n_walls:]
        targets = frozenset(free[:N_BOXES])
        boxes = frozenset(free[N_BOXES : 2 * N_BOXES])
        level = Level(walls=walls, targets=targets, boxes=boxes, player=free[2 * N_BOXES])
        if _dead(level, boxes):
            continue
        plan = solve(level, level.player, boxes, max_moves=MAX_MOVES)
        if plan is not None and len(plan) >= MIN_MOVES:
            return level, len(plan)


def _relative(frm: Pos, to: Pos) -> str:
    dr, dc = to[0] - frm[0], to[1] - frm[1]
    parts = []
    if dr:
        parts.append(f"{abs(dr)} {'down' if dr > 0 else 'up'}")
    if dc:
        parts.append(f"{abs(dc)} {'right' if dc > 0 else 'left'}")
    return ", ".join(parts) or "here"


@register_env("Sokoban-6x6")
class SokobanEnv(TextEnv):
    name = "Sokoban-6x6"
    max_turns = 40
    action_syntax = "Answer with one move: up, down, left or right (north, south, west, east also work)."
    instructions = (
        "You play Sokoban on a 6x6 grid. You can walk onto floor and targets; walking into a box pushes it "
        "one square in the same direction if the square behind it is free. Boxes cannot be pulled, and a "
        "box pushed into a corner is stuck for good. Put every box on a target."
    )
    goal_text = "Push both boxes ($) onto the two targets (.)."

    def __init__(self, split: str = "train") -> None:
        super().__init__(split)
        self._eval: list[dict[str, Any]] | None = None
        self.level: Level | None = None
        self.player: Pos = (0, 0)
        self.boxes: frozenset[Pos] = frozenset()
        self._plan: list[str] = []
        self._plan_state: tuple[Pos, frozenset[Pos]] | None = None

    def eval_instances(self) -> list[dict[str, Any]]:
        if self._eval is None:
            self._eval = load_split(split_path(self.name))
        return self._eval

    def num_instances(self) -> int | None:
        return len(self.eval_instances()) if self.split == "eval" else None

    def _reset(self, seed: int) -> tuple[str, StepInfo]:
        if self.split == "eval":
            instances = self.eval_instances()
            self.level = Level.from_rows(instances[seed % len(instances)]["level"])
        else:
            self.level, _ = generate(TRAIN_SEEDS[seed % len(TRAIN_SEEDS)])
        self.player, self.boxes = self.level.player, self.level.boxes
        self._plan, self._plan_state = [], None
        info = StepInfo(goal=self.goal_text, admissible_actions=self.admissible_actions())
        return f"Goal: {self.goal_text}\n{self.render()}", info

    def _step(self, action: str) -> tuple[str, float, bool, StepInfo]:
        assert self.level is not None
        nxt = apply_move(self.level, self.player, self.boxes, action)
        if nxt is None:
            message = f"You cannot move {action}: the way is blocked. Nothing happened."
        else:
            pushed = nxt[1] != self.boxes
            self.player, self.boxes = nxt
            message = f"You moved {action}" + (" and pushed a box." if pushed else ".")
        success = self.boxes == self.level.targets
        if success:
            message += " Both boxes are on targets: puzzle solved!"
        info = StepInfo(goal=self.goal, success=success, admissible_actions=self.admissible_actions())
        reward = self.success_reward if success else self.failure_reward
        return f"{message}\n{self.render()}", reward, success, info

    def parse_action(self, text: str) -> str | None:
        m = _ACTION_RE.search(text.lower())
        if m is None:
            return None
        return _SYNONYMS.get(m.group(1), m.group(1))

    def render(self) -> str:
        assert self.level is not None
        rows = [render_row(self.level, r, self.player, self.boxes) for r in range(SIZE)]
        on = len(self.boxes & self.level.targets)
        lines = [
            "Map (row 1 at the top):",
            *rows,
            "Legend: # wall, _ floor, . target, $ box, * box on a target, @ you, + you on a target.",
        ]
        for box in sorted(self.boxes):
            where = " (on a target)" if box in self.level.targets else ""
            lines.append(f"- box{where}: {_relative(self.player, box)}")
        for target in sorted(self.level.targets - self.boxes):
            lines.append(f"- empty target: {_relative(self.player, target)}")
        lines.append(f"Boxes on targets: {on} of {len(self.level.targets)}.")
        return "\n".join(lines)

    def admissible_actions(self) -> list[str]:
        assert self.level is not None
        return [m for m in MOVES if apply_move(self.level, self.player, self.boxes, m) is not None]

    def expert_action(self) -> str:
        assert self.level is not None
        state = (self.player, self.boxes)
        if state != self._plan_state or not self._plan:
            self._plan = solve(self.level, self.player, self.boxes) or []
        if not self._plan:  # deadlocked: nothing solves it any more
            return (self.admissible_actions() or ["up"])[0]
        move = self._plan.pop(0)
        nxt = apply_move(self.level, self.player, self.boxes, move)
        self._plan_state = nxt
        return move


def write_eval_split(size: int = EVAL_SIZE) -> None:
    """Generate and freeze the eval levels (done once; the file is committed).

    ``python -c "from trainer.envs.sokoban import write_eval_split; write_eval_split()"``
    """
    rng = random.Random("Sokoban-6x6/eval")
    instances = []
    for seed in rng.sample(EVAL_SEEDS, size):
        level, optimal = generate(seed)
        instances.append({"seed": seed, "level": level.rows(), "optimal_moves": optimal})
    write_split(split_path("Sokoban-6x6"), instances)

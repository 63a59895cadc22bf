"""The ``ALFWorld`` text environment: household tasks on the real ALFWorld/TextWorld engine."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import ClassVar

from trainer.envs.alfworld.engine import INSTALL_HINT, Engine
from trainer.envs.alfworld.sources import GeneratedGames, OfficialGames, official_root
from trainer.envs.base import StepInfo, TextEnv, register_env

_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
_GOAL = re.compile(r"Your task is to: (.*?)\.?\s*$", re.S)
_MARKER = re.compile(r"(?:action|command)\s*:|^\s*>", re.I | re.M)
_NUMBER = re.compile(r" \d+")
_ARTICLES = {"a", "an", "the", "some"}
# Verbs models know from other ALFWorld versions and plain English -> this engine's verbs.
_SYNONYMS = (
    (re.compile(r"\b(?:put|place) (.+?) (?:in|on|into|onto|in on) (.+)"), r"move \1 to \2"),
    (re.compile(r"\bpick up (.+?) from (.+)"), r"take \1 from \2"),
    (re.compile(r"\b(?:turn on|switch on|toggle) (.+)"), r"use \1"),
    (re.compile(r"\b(?:walk|head|navigate) to (.+)"), r"go to \1"),
)


def _canon(text: str) -> str:
    words = re.sub(r"[^a-z0-9]+", " ", text.lower()).split()
    return " ".join(w for w in words if w not in _ARTICLES)


def match_command(text: str, admissible: list[str]) -> str | None:
    """The admissible command that ``text`` asks for, or None.

    Tolerant: ignores case, punctuation, articles and words around the command, reads only what
    follows the last ``Action:`` / ``>`` marker when there is one, and knows a few verb synonyms.
    Strict: the result is always one of ``admissible``, never a guess between several.
    """
    markers = list(_MARKER.finditer(text))
    if markers:
        text = text[markers[-1].end() :]
    said = _canon(text.strip().split("\n")[0] if markers else text)
    for pattern, repl in _SYNONYMS:
        said = pattern.sub(repl, said)
    padded = f" {said} "
    by_canon = {_canon(c): c for c in admissible}
    if said in by_canon:
        return by_canon[said]
    # The longest command said in full (so "take apple 1 from countertop 1" beats "look").
    found = [(len(c), -padded.find(f" {c} "), cmd) for c, cmd in by_canon.items() if f" {c} " in padded]
    if found:
        return max(found)[2]
    # A command said without its object numbers ("go to fridge"), if only one command fits.
    if not re.search(r"\d", said):
        fits = {cmd for c, cmd in by_canon.items() if " " + _NUMBER.sub("", c) + " " in padded}
        longest = max((len(_canon(c)) for c in fits), default=0)
        fits = {c for c in fits if len(_canon(c)) == longest}
        if len(fits) == 1:
            return fits.pop()
    return None


@register_env("ALFWorld")
class ALFWorldEnv(TextEnv):
    """ALFWorld (TextWorld engine, ALFRED PDDL domain) with six task types.

    ``split="train"`` and ``"eval"`` use disjoint floor plans; games are generated locally (see
    ``sources.py``) unless ``data_dir`` (or ``$ALFWORLD_DATA``) holds the official
    ``json_2.1.1`` layout. One engine stays warm per env; ``reset`` switches its game.
    """

    name: ClassVar[str] = "ALFWorld"
    max_turns: ClassVar[int] = 50
    success_reward: ClassVar[float] = 1.0
    failure_reward: ClassVar[float] = -1.0
    action_syntax: ClassVar[str] = (
        "Write exactly one command, e.g. 'go to countertop 1', 'open fridge 1', 'take apple 1 from "
        "countertop 1', 'move apple 1 to fridge 1', 'heat apple 1 with microwave 1', 'clean apple 1 "
        "with sinkbasin 1', 'cool apple 1 with fridge 1', 'use desklamp 1', 'examine apple 1', "
        "'inventory' or 'look'. Use the numbered names as the game shows them."
    )
    instructions: ClassVar[str] = (
        "You are in a house and must complete a household task, such as putting a cleaned, heated or "
        "cooled object somewhere, or looking at an object under a lamp. Go to receptacles to see "
        "what is on or in them, open closed ones, take objects and use appliances. You hold one object "
        "at a time. You win when the task is done; you fail when the turns run out."
    )

    def __init__(self, split: str = "train", data_dir: str | Path | None = None) -> None:
        super().__init__(split)
        for module in ("alfworld", "textworld", "fast_downward"):
            if importlib.util.find_spec(module) is None:
                raise ImportError(INSTALL_HINT)
        root = Path(data_dir) if data_dir is not None else official_root()
        self.games: GeneratedGames | OfficialGames = (
            OfficialGames(root, split) if root is not None else GeneratedGames(split)
        )
        self._engine: Engine | None = None
        self._plan: list[str] | None = None
        self._admissible: list[str] = []

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine()
        return self._engine

    def num_instances(self) -> int | None:
        return self.games.num_instances()

    def _reset(self, seed: int) -> tuple[str, StepInfo]:
        path = self.games.game_file(seed, self.engine)
        self.engine.load(path)
        obs, self._admissible, _ = self.engine.reset()
        obs = obs.replace(_BANNER, "").strip()
        match = _GOAL.search(obs)
        goal = match.group(1) if match else ""
        self._plan = self._walkthrough(path)
        return obs, StepInfo(
            goal=goal, admissible_actions=list(self._admissible), extra={"game_file": str(path)}
        )

    @staticmethod
    def _walkthrough(path: Path) -> list[str] | None:
        return list(json.loads(path.read_text()).get("walkthrough") or []) or None

    def _step(self, action: str) -> tuple[str, float, bool, StepInfo]:
        obs, self._admissible, won = self.engine.step(action)
        # Keep the expert's plan while the episode follows it; any other action invalidates it.
        self._plan = self._plan[1:] if self._plan and self._plan[0] == action else None
        reward = self.success_reward if won else 0.0
        info = StepInfo(goal=self.goal, success=won, admissible_actions=list(self._admissible))
        return obs, reward, won, info

    def parse_action(self, text: str) -> str | None:
        return match_command(text, self._admissible)

    def admissible_actions(self) -> list[str] | None:
        return list(self._admissible)

    def expert_action(self) -> str:
        """The planner expert's next action: the stored walkthrough while the episode follows it,
        else a fresh plan from the current state (fast-downward, as ALFWorld's planner expert)."""
        if not self._plan or self._plan[0] not in self._admissible:
            self._plan = self.engine.expert_plan() or None
        return self._plan[0] if self._plan else "look"

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

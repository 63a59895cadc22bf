"""One text protocol for every environment, a registry by name, and task mixtures.

An environment is built for one split (``"train"`` or ``"eval"``); ``reset(seed)`` picks the
instance ``seed`` of that split, so the same seed always gives the same episode. Train and eval
splits differ by a generator factor (floor plan, product/template, source project, map seed
range), not only by seed; an env's eval split is frozen in a file with a checksum (see
``splits.py``).
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

SPLITS = ("train", "eval")


@dataclass
class StepInfo:
    """What ``reset`` and ``step`` report besides the observation.

    Envs may add their own keys to ``extra``; ``as_dict`` flattens it for the caller.
    """

    goal: str
    success: bool = False
    invalid_action: bool = False
    admissible_actions: list[str] | None = None
    turn: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        return d | self.extra


class TextEnv(abc.ABC):
    """Base class of every environment.

    Subclasses set the class attributes and implement ``_reset``, ``_step``, ``parse_action``
    and ``expert_action``. The base class counts turns, enforces the turn limit, turns an
    unparseable action into a clear invalid-action observation (the episode goes on), and
    derives ``expert(seed)`` from the closed-loop ``expert_action``.
    """

    name: ClassVar[str]
    max_turns: ClassVar[int]
    action_syntax: ClassVar[str]
    """How to write an action, for the actor's system prompt."""
    instructions: ClassVar[str]
    """What the task is about, for the actor's system prompt."""
    success_reward: ClassVar[float] = 1.0
    failure_reward: ClassVar[float] = 0.0

    def __init__(self, split: str = "train") -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
        self.split = split
        self.turn = 0
        self.done = True
        self.goal = ""

    # ---- what subclasses implement -------------------------------------------------------
    @abc.abstractmethod
    def _reset(self, seed: int) -> tuple[str, StepInfo]:
        """Start instance ``seed`` of this split; return the first observation and info."""

    @abc.abstractmethod
    def _step(self, action: str) -> tuple[str, float, bool, StepInfo]:
        """Execute an already-parsed, well-formed action."""

    @abc.abstractmethod
    def parse_action(self, text: str) -> str | None:
        """Free model text -> the action to execute, or None when nothing valid is in it.

        Tolerant of extra words around the action, strict about what gets executed.
        """

    @abc.abstractmethod
    def expert_action(self) -> str:
        """The oracle's next action from the current state (may use privileged state)."""

    def num_instances(self) -> int | None:
        """How many instances this split holds, or None for a generator without bound."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, most envs hold nothing
        """Free what the env holds (processes, files)."""

    # ---- the protocol --------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.turn = 0
        self.done = False
        obs, info = self._reset(seed)
        self.goal = info.goal
        return obs, info.as_dict()

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.done:
            raise RuntimeError(f"{self.name}: step() after the episode ended; call reset(seed)")
        self.turn += 1
        action = self.parse_action(action_text)
        if action is None:
            obs, reward, done, info = self._invalid(action_text)
        else:
            obs, reward, done, info = self._step(action)
        info.turn = self.turn
        if not done and self.turn >= self.max_turns:
            done = True
            reward = self.failure_reward
            obs += f"\nTurn limit of {self.max_turns} reached: the episode is over."
            info.extra["truncated"] = True
        self.done = done
        return obs, reward, done, info.as_dict()

    def _invalid(self, action_text: str) -> tuple[str, float, bool, StepInfo]:
        shown = action_text.strip().replace("\n", " ")[:80]
        obs = f'Invalid action: "{shown}". Nothing happened. {self.action_syntax}'
        info = StepInfo(goal=self.goal, invalid_action=True, admissible_actions=self.admissible_actions())
        return obs, 0.0, False, info

    def admissible_actions(self) -> list[str] | None:
        """The actions valid now, where the env knows them."""
        return None

    def expert(self, seed: int) -> list[str]:
        """A solving action sequence for instance ``seed`` (runs the closed-loop oracle)."""
        self.reset(seed)
        actions: list[str] = []
        while not self.done:
            action = self.expert_action()
            actions.append(action)
            self.step(action)
        return actions


# ---- registry ------------------------------------------------------------------------------
EnvFactory = Callable[..., TextEnv]
_REGISTRY: dict[str, EnvFactory] = {}


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Register a factory (usually the class) under ``name``."""

    def deco(factory: EnvFactory) -> EnvFactory:
        if name in _REGISTRY:
            raise ValueError(f"environment {name!r} is registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def make_env(name: str, split: str = "train", **kwargs: Any) -> TextEnv:
    from trainer import envs  # noqa: F401  (registers every env; here, as the package imports this module)

    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown environment {name!r}; known: {known}") from None
    return factory(split=split, **kwargs)


def env_names() -> list[str]:
    from trainer import envs  # noqa: F401  (registers every env; here, as the package imports this module)

    return sorted(_REGISTRY)


# ---- task mixtures -------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskMixture:
    """Named envs with sampling weights. A single env is a mixture of one."""

    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        if not self.weights or any(w <= 0 for w in self.weights.values()):
            raise ValueError("a task mixture needs at least one env, each with a weight > 0")

    @property
    def names(self) -> list[str]:
        return list(self.weights)

    def sample(self, rng: random.Random) -> str:
        names = list(self.weights)
        return rng.choices(names, weights=[self.weights[n] for n in names])[0]


MIXTURES: dict[str, dict[str, float]] = {
    "3-task": {"MiniHack-Room-15x15": 1.0, "WebShop-synth": 1.0, "ALFWorld": 1.0},
    "6-task": {
        "MiniHack-Room-15x15": 1.0,
        "WebShop-synth": 1.0,
        "ALFWorld": 1.0,
        "MiniHack-MazeWalk-9x9": 1.0,
        "MiniHack-KeyRoom-Dark-S5": 1.0,
        "Sokoban-6x6": 1.0,
    },
}


def make_mixture(name: str) -> TaskMixture:
    """``name`` is a mixture name (``3-task``), or one env name."""
    if name in MIXTURES:
        return TaskMixture(MIXTURES[name])
    if name not in env_names():
        raise ValueError(f"unknown environment or mixture {name!r}; mixtures: {', '.join(MIXTURES)}")
    return TaskMixture({name: 1.0})

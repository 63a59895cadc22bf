"""The ALFWorld text engine: TextWorld's PDDL environment behind ALFWorld's own wrappers.

``alfworld`` and ``textworld`` are imported only here and only when an engine is built, so that
``import trainer.envs`` works where they are missing.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import types
from pathlib import Path
from typing import Any

from trainer.paths import cache_dir

INSTALL_HINT = "ALFWorld needs the alfworld package: pip install alfworld==0.4.2 (not alfworld[full])"


def import_alfworld() -> None:
    """Import ``alfworld`` with ``ALFWORLD_DATA`` set, so that it does not create ``~/.cache/alfworld``."""
    os.environ.setdefault("ALFWORLD_DATA", str(cache_dir("alfworld")))
    try:
        import alfworld.info  # noqa: F401  (heavy and optional: imported only when needed, see above)
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc


def alfworld_package_dir() -> Path:
    """The installed ``alfworld`` package folder (found without importing it)."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or spec.origin is None:
        raise ImportError(INSTALL_HINT)
    return Path(spec.origin).parent


@functools.cache
def _speed_up_textworld() -> None:
    """Memoise three pure, slow steps of TextWorld's PDDL engine (same results, less CPU).

    - ``PddlState`` runs fast-downward's Python translator twice (plain and optimised) whenever it
      is built, and ``PddlEnv`` builds one on ``load`` and again on every ``reset``: about a second
      per call for an ALFWorld problem. The translation is a pure function of the two texts.
    - Every step re-derives the text of every admissible command, re-parsing the same grammar
      templates and conditions with a PEG parser each time (most of the step's time). The parses
      are kept and each caller gets its own deep copy, since derivation mutates them.
    """
    # textworld and its planner: heavy and optional (module docstring)
    import fast_downward
    from textworld import logic as tw_logic
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen

    view = types.SimpleNamespace(**{k: getattr(fast_downward, k) for k in dir(fast_downward)})
    view.pddl2sas = functools.lru_cache(maxsize=32)(fast_downward.pddl2sas)
    pddl_logic.fast_downward = view
    for module in (textgen, tw_logic):
        module._parse_and_convert = _memoised_parse(module._parse_and_convert)


def _memoised_parse(parse: Any) -> Any:
    @functools.lru_cache(maxsize=8192)
    def parsed(text: str, rule_name: str) -> Any:
        return parse(text, rule_name=rule_name)

    def parse_copy(text: str, rule_name: str, **_: Any) -> Any:
        return copy.deepcopy(parsed(text, rule_name))

    return parse_copy


class GameNotSolvable(RuntimeError):
    """The planner found no plan (or the problem does not ground), so the game cannot be played."""


class Engine:
    """One warm TextWorld PDDL engine; ``load`` switches it to another game file.

    The stack is ALFWorld's: ``AlfredExpert(AlfredInfos(AlfredDemangler(PddlEnv)))``. The planner
    expert's plan is not recomputed on every step (that doubles the step cost); ``expert_plan()``
    asks the planner for the current state when the expert is actually wanted.
    """

    def __init__(self) -> None:
        import_alfworld()
        # alfworld and textworld: heavy and optional, imported when an engine is built (module docstring)
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv

        _speed_up_textworld()
        infos = textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])
        self._pddl = PddlEnv(infos)
        self._env = AlfredInfos(AlfredDemangler(self._pddl, shuffle=False))
        self.game_file: str | None = None
        self.state: Any = None

    def load(self, game_file: str | Path) -> None:
        game_file = str(game_file)
        if game_file != self.game_file:
            self.game_file = None
            try:
                self._env.load(game_file)
            except (KeyError, SystemExit) as exc:  # the translator fails on problems it cannot ground
                raise GameNotSolvable(f"{game_file}: the PDDL problem does not ground ({exc!r})") from exc
            self.game_file = game_file

    def reset(self) -> tuple[str, list[str], bool]:
        self.state = self._env.reset()
        return self.state.feedback, self.admissible(), bool(self.state["won"])

    def step(self, command: str) -> tuple[str, list[str], bool]:
        self.state, _, _ = self._env.step(command)
        return self.state.feedback, self.admissible(), bool(self.state["won"])

    def admissible(self) -> list[str]:
        return list(self.state["admissible_commands"])

    def expert_plan(self) -> list[str]:
        """The planner expert's plan from the current state ([] when there is none)."""
        return list(self._pddl._pddl_state.replan(self._pddl._entity_infos))

    def close(self) -> None:
        # Free the planner's memory but keep its library mapped: fast_downward.close_lib also dlcloses it,
        # and the C++ exit handlers it registered then crash the interpreter at exit (SIGSEGV).
        self._pddl.downward_lib.cleanup()

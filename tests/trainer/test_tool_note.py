"""How a guided episode's prompt offers Search-and-Ask (``experience.tool_note``): each style says how to
ask and the limit, the example is itself a question the intercept reads, and a run without the tool says
nothing of it. With ``experience.tool_offer`` 'stuck' the tool is offered only where the episode is stuck."""

from __future__ import annotations

import pytest

from trainer.coevolution import SEARCH_TAG, STUCK, TOOL_NOTES, SearchAndAsk, tool_note
from trainer.config import ConfigError, get_preset
from trainer.rollout.runner import EpisodeSpec, EpisodeState, Experience, Turn


@pytest.mark.parametrize("style", ["plain", "example"])
def test_each_style_says_how_to_ask_and_how_often(style):
    cfg = get_preset("cpu").with_overrides(method="complementary", **{"experience.tool_note": style})
    note = tool_note(cfg)
    limit = cfg.experience.search_and_ask_max
    assert "<search>your question</search>" in note and f"At most {limit} questions" in note
    assert ("for example" in note) == (style == "example")


def test_the_example_is_a_question_the_intercept_reads():
    questions = [m.group(1) for m in SEARCH_TAG.finditer(TOOL_NOTES["example"])]
    assert questions == ["your question", "Which way are the stairs?"]


def test_no_note_without_the_tool_and_an_unknown_style_is_refused_by_name():
    assert tool_note(get_preset("cpu").with_overrides(method="grpo")) == ""
    off = get_preset("cpu").with_overrides(method="complementary", no_search_and_ask=True)
    assert tool_note(off) == ""
    with pytest.raises(ConfigError, match="tool_note"):
        get_preset("cpu").with_overrides(**{"experience.tool_note": "loud"})


def _stuck_tool(offer: str = "stuck"):
    cfg = get_preset("cpu").with_overrides(method="complementary", **{"experience.tool_offer": offer})
    return SearchAndAsk(None, None, cfg, None), cfg


def _state(*turns: tuple[str, bool, bool], now: str, guided: bool = True) -> EpisodeState:
    """An episode whose turns saw (observation, invalid, intercepted) each, and now sees ``now``."""
    state = EpisodeState(EpisodeSpec("MiniHack-Room-5x5", 0, guided=guided), None, now, "reach the stairs")
    state.experience = Experience("The stairs are 2 east.") if guided else None
    state.turns = [
        Turn(obs, "east", "east", 0.0, invalid, False, 1, "stop", 0, ask) for obs, invalid, ask in turns
    ]
    return state


def test_at_a_stuck_point_the_tool_is_offered_and_nowhere_else():
    tool, cfg = _stuck_tool()
    note = STUCK + tool_note(cfg)
    assert tool.offer(_state(now="start")) is None  # nothing played yet
    assert tool.offer(_state(("start", False, False), now="moved")) is None
    assert tool.offer(_state(("start", True, False), now="start, invalid")) == note
    assert tool.offer(_state(("wall", False, False), now="wall")) == note  # the move changed nothing
    assert tool.offer(_state(("a", False, False), ("b", False, False), now="a")) == note  # back again
    assert tool.offer(_state(("a", False, True), now="a")) is None  # the tool answered that turn
    asked = [("q", False, True)] * cfg.search_and_ask_limit
    assert tool.offer(_state(*asked, ("wall", True, False), now="wall")) is None  # no asks left
    assert tool.offer(_state(("wall", True, False), now="wall", guided=False)) is None
    always, _ = _stuck_tool("always")  # the note is in the experience then, never offered apart
    assert always.offer(_state(("wall", True, False), now="wall")) is None
    with pytest.raises(ConfigError, match="tool_offer"):
        get_preset("cpu").with_overrides(**{"experience.tool_offer": "sometimes"})

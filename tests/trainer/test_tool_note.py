"""How a guided episode's prompt offers Search-and-Ask (``experience.tool_note``): each style says how to
ask and the limit, the example is itself a question the intercept reads, and a run without the tool says
nothing of it."""

from __future__ import annotations

import pytest

from trainer.coevolution import SEARCH_TAG, TOOL_NOTES, tool_note
from trainer.config import ConfigError, get_preset


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

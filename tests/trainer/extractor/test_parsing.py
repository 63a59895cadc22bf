"""The extractor's parsers on good, bad and half-good answers, and the JSON schemas they pair with."""

from __future__ import annotations

import json

import jsonschema
import pytest

from trainer.extractor import parsing
from trainer.extractor import prompts as xp
from trainer.store import Entry, MergeAction

GOOD = json.dumps(
    {
        "operations": [
            {
                "op": "add",
                "title": "Reach the stairs",
                "content": "Find > on the map and walk straight to it.",
            },
            {"op": "return", "title": "Nothing new", "content": "Same as before."},
        ]
    }
)


def test_a_good_distil_answer_gives_its_operations():
    out = parsing.parse_distil(GOOD)
    assert out.ok and not out.errors and not out.repaired
    assert out.items == [
        parsing.ParsedOp("add", "Reach the stairs", "Find > on the map and walk straight to it."),
        parsing.ParsedOp("return"),
    ]


def test_chatter_around_the_json_is_ignored():
    out = parsing.parse_distil(f"Sure! Here is my answer:\n```json\n{GOOD}\n```\nHope it helps.")
    assert out.ok and len(out.items) == 2


def test_a_truncated_answer_is_closed_and_its_complete_items_kept():
    cut = GOOD[: GOOD.index('{"op": "return"') + 11]  # ends inside the second operation
    assert cut.endswith('{"op": "ret')
    out = parsing.parse_distil(cut)
    assert out.repaired and out.ok
    assert [o.title for o in out.items] == ["Reach the stairs"]
    # the cut-off item became {"op": "ret"}: dropped with an error, never a crash
    assert out.errors == ["operation 1: unknown op 'ret'"]
    # cut after a key or a comma: still closed into valid JSON
    assert parsing.parse_distil(GOOD[: GOOD.index('"content"') + 10]).repaired
    assert parsing.parse_distil(GOOD[: GOOD.index("}, {") + 3]).items[0].title == "Reach the stairs"


def test_a_half_good_answer_keeps_the_good_items_and_counts_the_bad():
    answer = {
        "operations": [
            {"op": "add", "title": "Doors", "content": "Open doors before walking through."},
            {"op": "add", "title": "", "content": "no title"},
            {"op": "teleport", "title": "x", "content": "y"},
            "not an object",
        ]
    }
    out = parsing.parse_distil(json.dumps(answer))
    assert out.ok
    assert out.items == [parsing.ParsedOp("add", "Doors", "Open doors before walking through.")]
    assert len(out.errors) == 3


@pytest.mark.parametrize("text", ["", "I cannot help with that.", "{not json at all", '{"foo": 1}', "[1, 2]"])
def test_garbage_is_unparseable_not_an_exception(text):
    out = parsing.parse_distil(text)
    assert not out.ok and not out.items and out.errors


def test_update_without_a_retrieved_entry_becomes_add_and_ops_are_capped():
    ops = [{"op": "update", "title": f"t{i}", "content": f"rule number {i} for the game"} for i in range(5)]
    out = parsing.parse_distil(json.dumps({"operations": ops}), max_ops=3, can_update=False)
    assert [o.kind for o in out.items] == ["add", "add", "add"]
    assert any("beyond 3" in e for e in out.errors)


def test_merge_answers():
    ids = [4, 7, 9]
    good = {
        "actions": [
            {"kind": "merge", "ids": [4, 7], "title": "T", "content": "C"},
            {"kind": "keep", "ids": [9]},
        ]
    }
    out = parsing.parse_merge(json.dumps(good), ids)
    assert out.ok and out.items == [MergeAction("merge", (4, 7), "T", "C"), MergeAction("keep", (9,))]
    half = {
        "actions": [
            {"kind": "discard", "ids": [4]},
            {"kind": "discard", "ids": [99]},
            {"kind": "rewrite", "ids": [7]},
        ]
    }
    out = parsing.parse_merge(json.dumps(half), ids)
    assert out.ok and out.items == [MergeAction("discard", (4,))] and len(out.errors) == 2
    keep_all = parsing.parse_merge('{"actions": []}', ids)
    assert keep_all.ok and keep_all.items == []
    assert not parsing.parse_merge('{"actions": [{"kind": "merge", "ids": [1]}]}', ids).ok
    assert not parsing.parse_merge("merge them all", ids).ok


def test_refine_answers():
    assert parsing.parse_refine('{"advice": "Go east."}').items == ["Go east."]
    plain = parsing.parse_refine("Go east, then south.")
    assert not plain.ok and plain.items == ["Go east, then south."]
    assert parsing.parse_refine("   ").items == []


def test_the_schemas_accept_what_the_parsers_accept_and_bound_the_answer():
    jsonschema.validate(json.loads(GOOD), xp.distil_schema(3))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            json.loads(GOOD.replace('"add"', '"update"')), xp.distil_schema(3, can_update=False)
        )
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"operations": [json.loads(GOOD)["operations"][0]] * 4}, xp.distil_schema(3))
    merge = {"actions": [{"kind": "merge", "ids": [4, 7], "title": "T", "content": "C"}]}
    jsonschema.validate(merge, xp.merge_schema([4, 7]))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"actions": [{**merge["actions"][0], "ids": [5]}]}, xp.merge_schema([4, 7]))
    jsonschema.validate({"advice": "x"}, xp.refine_schema())


def test_prompts_show_the_episode_the_outcome_and_the_retrieved_entry():
    steps = [xp.Step(f"observation {i}", f"action {i}") for i in range(50)]
    entry = Entry(id=3, scope="s", title="Old advice", content="Walk east.")
    (system, user) = xp.distil_messages(
        "reach the stairs", steps, True, 1.0, entry, max_ops=2, budget_chars=600
    )
    assert "at most 2 operations" in system["content"]
    text = user["content"]
    assert "Goal: reach the stairs" in text and "SUCCESS" in text and "Old advice" in text
    # the trajectory fits its budget by dropping the earliest turns
    assert "action 49" in text and "action 0\n" not in text and "earlier turns omitted" in text
    (_, user) = xp.distil_messages("g", steps[:2], False, 0.0, None)
    assert "FAILURE" in user["content"] and "none" in user["content"]


def test_repeated_and_uninformative_operations_are_dropped_with_their_reason():
    good = {"op": "add", "title": "Walk to >", "content": "Move in the direction the legend gives for >."}
    ops = [
        good,
        dict(good),
        {"op": "add", "title": "Nothing happened.", "content": "Nothing happened."},
        {"op": "add", "title": "It's solid stone", "content": "It's solid stone"},
        {"op": "add", "title": "Dots", "content": "..."},
        {"op": "add", "title": "t", "content": "{{lessonEnd}} ."},
        {"op": "add", "title": "Numbers", "content": "46.5, 17.1, 23, 20, 22, 24, 26"},
        {"op": "add", "title": "Loop", "content": "Splendor-of-" * 20},
    ]
    out = parsing.parse_distil(json.dumps({"operations": ops}), max_ops=10)
    assert [o.title for o in out.items] == ["Walk to >"] and out.ok
    reasons = " | ".join(out.errors)
    assert "repeats an earlier operation" in reasons and "repeats the title" in reasons
    assert (
        reasons.count("says nothing reusable") == 4
    )  # "Nothing happened.", "...", "{{lessonEnd}} .", numbers
    assert "content repeats itself" in reasons

"""The extractor's counters and its log of unparseable answers."""

from __future__ import annotations

import json

from trainer.extractor import parsing
from trainer.extractor.model import ExtractorStats


def test_every_unparseable_answer_is_logged_whole_with_why_and_usable_ones_are_not(tmp_path):
    log = tmp_path / "extractor_failures.jsonl"
    stats = ExtractorStats(failure_log=log)
    chatter = "I think the agent should go north. " * 20  # longer than the in-memory excerpt
    usable = '{"operations": [{"op": "add", "title": "Stairs", "content": "Walk toward the > sign."}]}'
    for answer in (chatter, usable, '{"operations": [{"op": "add", "title": "cut'):
        stats.record("distil", parsing.parse_distil(answer, max_ops=3, can_update=False), answer, tokens=7)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert stats.unparseable["distil"] == len(lines) == 2
    assert lines[0]["answer"] == chatter and lines[0]["errors"] == ["no JSON object in the answer"]
    assert lines[1]["job"] == "distil" and lines[1]["errors"] and lines[1]["tokens"] == 7


def test_without_a_log_nothing_is_written(tmp_path):
    stats = ExtractorStats()
    stats.record("merge", parsing.parse_distil("nothing", max_ops=3, can_update=False), "nothing")
    assert stats.unparseable["merge"] == 1 and not list(tmp_path.iterdir())


def test_the_counters_survive_a_checkpoint_and_an_old_checkpoint_starts_them_at_zero():
    stats = ExtractorStats()
    stats.record("distil", parsing.parse_distil("no json", max_ops=3, can_update=False), "no json", tokens=5)
    stats.ops["add"] += 2
    resumed = ExtractorStats()
    resumed.load_state_dict(stats.state_dict())
    assert resumed.as_metrics() == stats.as_metrics()
    assert resumed.as_metrics()["extractor/distil_tokens"] == 5.0
    resumed.load_state_dict({})
    assert resumed.as_metrics()["extractor/parse_failures"] == 0.0

"""``cell.json`` of a run trained from the command line: attempts, commits, status."""

from __future__ import annotations

from trainer import runrecord
from trainer.config import get_preset

CFG = get_preset("cpu").with_overrides(method="grpo", env="MiniHack-Room-Dark-5x5-Pool", seed=3)


def test_a_fresh_run_records_its_method_env_seed_and_first_attempt(tmp_path):
    record = runrecord.start_attempt(tmp_path, CFG, 0, ["python", "-m", "trainer.train", "--out", "x"])
    on_disk = runrecord.read_record(tmp_path)
    assert on_disk == record
    assert (record["method"], record["env"], record["seed"], record["status"]) == (
        "grpo",
        "MiniHack-Room-Dark-5x5-Pool",
        3,
        "running",
    )
    (attempt,) = record["attempts"]
    assert attempt["from_step"] == 0 and attempt["command"] == "python -m trainer.train --out x"
    assert len(attempt["commit"]) == 40 and attempt["threads"] >= 1 and attempt["cpu"]
    assert record["environment"]["code_version"] == attempt["commit"]


def test_a_resume_adds_an_attempt_and_keeps_the_start(tmp_path):
    first = runrecord.start_attempt(tmp_path, CFG, 0, ["train"])
    runrecord.finish(tmp_path, "failed")
    assert runrecord.read_record(tmp_path)["status"] == "failed"
    again = runrecord.start_attempt(tmp_path, CFG, 10, ["train", "--resume", "x"])
    assert [a["from_step"] for a in again["attempts"]] == [0, 10]
    assert (again["uid"], again["started_at"]) == (first["uid"], first["started_at"])
    assert (again["status"], again["finished_at"]) == ("running", None)
    runrecord.finish(tmp_path, "succeeded")
    done = runrecord.read_record(tmp_path)
    assert done["status"] == "succeeded" and done["finished_at"] >= done["started_at"]


def test_attempts_under_different_commits_are_listed_in_order():
    record = {"attempts": [{"commit": "a"}, {"commit": "b"}, {"commit": "b"}, {"commit": "a"}]}
    assert runrecord.attempt_commits(record) == ["a", "b"]
    assert runrecord.attempt_commits({"attempts": [{"commit": "a"}]}) == ["a"]

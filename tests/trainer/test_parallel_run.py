"""One run on 2 processes from the command line (issue 36): ``python -m trainer.train --nproc 2`` starts
torchrun; the ranks train one grpo run on a tiny random Llama, rank 0 writes each metric row once, the
checkpoints are DCP folders with a whole actor beside them, and the run resumes from them, on 2 processes
and on 1 (issue 47). A torchrun group that fails says how to resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.trainer.test_checkpoint import _save
from tests.trainer.tiny_models import tiny_llama_folder
from trainer.train import main as train_main

REPO = Path(__file__).resolve().parents[2]
SETTINGS = (
    "tasks_per_step=1 k_rollouts=4 eval_episodes=2 eval_every=0 checkpoint_every=1"
    " rollout.kv_cache_gib=0.0625"
    " rollout.max_new_tokens=8 rollout.turn_limit=3 rollout.dtype=float32"
)
SMALL = [arg for setting in SETTINGS.split() for arg in ("--set", setting)]


def _train(*args: str) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "trainer.train", *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def _rows(out: Path) -> Counter:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return Counter((row["kind"], row["step"]) for row in map(json.loads, lines))


def test_a_two_process_grpo_run_writes_each_row_once_checkpoints_shards_and_resumes(tmp_path):
    model, out = tiny_llama_folder(tmp_path / "tiny"), tmp_path / "run"
    common = ["--set", f"actor.model_path={model}", *SMALL, "--out", str(out)]
    _train("--config", "cpu", "--method", "grpo", "--steps", "2", "--nproc", "2", *common)
    assert _rows(out) == Counter({("eval", 0): 1, ("step", 1): 1, ("step", 2): 1, ("eval", 2): 1})
    saved = out / "checkpoints" / "step-000002"
    assert (saved / "dcp" / ".metadata").exists() and (saved / "actor" / "model.safetensors").exists()
    state = json.loads((saved / "state.json").read_text())
    assert state["config"]["nproc"] == 2 and state["engine_version"] == 2

    _train("--resume", str(out), "--steps", "3")
    assert _rows(out) == Counter(
        {("eval", 0): 1, ("step", 1): 1, ("step", 2): 1, ("eval", 2): 1, ("step", 3): 1, ("eval", 3): 1}
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step3 = next(r for r in rows if r["kind"] == "step" and r["step"] == 3)
    assert step3["engine/weight_version"] == 4  # the resumed engine was synced (3), then stepped (4)
    # each rank's share of the step and its memory, for the run page's process table
    assert step3["rank/0/episodes"] == step3["rank/1/episodes"] == step3["train/episodes"] / 2
    assert all(0.1 < step3[f"rank/{r}/rss_gib"] < 24 and step3[f"rank/{r}/tokens_per_s"] > 0 for r in (0, 1))
    assert (out / "checkpoints" / "step-000003" / "dcp" / ".metadata").exists()
    # rank 0 alone logs episodes, every rank's: each step's 4 and each evaluation's 2, once
    lines = (out / "episodes.jsonl").read_text().splitlines()
    batches = Counter((row["eval"], row["step"]) for row in map(json.loads, lines))
    assert batches == Counter({(True, 0): 2, (True, 2): 2, (True, 3): 2} | {(False, s): 4 for s in (1, 2, 3)})

    # the 2-process checkpoint resumed on 1 process (issue 47): the process count is no config change
    _train("--resume", str(out), "--steps", "4", "--nproc", "1")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert Counter((r["kind"], r["step"]) for r in rows)[("step", 4)] == 1
    step4 = next(r for r in rows if r["kind"] == "step" and r["step"] == 4)
    assert step4["engine/weight_version"] == 6  # resumed from version 4: synced (5), then stepped (6)
    saved = out / "checkpoints" / "step-000004"
    assert (saved / "optimizer.pt").exists() and not (saved / "dcp").exists()  # one process's format
    assert json.loads((saved / "state.json").read_text())["config"]["nproc"] == 1


def test_a_failed_torchrun_says_how_to_resume_on_any_number_of_processes(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    _save(out, 2, elapsed_s=1.0)  # an earlier attempt's checkpoint
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    missing = tmp_path / "no-model"  # every rank fails to load it
    args = ["--config", "cpu", "--method", "grpo", "--set", f"actor.model_path={missing}", "--out", str(out)]
    code = train_main([*args, "--nproc", "2"])
    err = capsys.readouterr().err
    assert code != 0
    assert f"torchrun exited with code {code}" in err and "last checkpoint (step-000002)" in err
    assert f"\n    python -m trainer.train --resume {out}\n" in err
    assert "add --nproc N to resume on another number of processes" in err

"""Wall time goes on across resumes: a run resumed in place (as after a crash) and a new run resumed from
another's checkpoint (the product's Resume) record, and export, wall times that increase in step order."""

from __future__ import annotations

import csv
import shutil

import pytest
from django.core.management import call_command
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.trainer.recording import Recorder
from trainer.checkpoint import read_checkpoint
from trainer.config import get_preset
from webapp.models import MetricRow, Run
from webapp.services import run_resume
from webapp.training import run_dir, run_training

pytestmark = pytest.mark.django_db(transaction=True)  # the run's heartbeat thread has a connection of its own

TINY = {"method": "grpo", "steps": 2, "tasks_per_step": 1, "k_rollouts": 2, "eval_every": 0,
        "eval_episodes": 1, "checkpoint_every": 1, "rollout.engine": "hf", "rollout.turn_limit": 2,
        "rollout.max_new_tokens": 8}  # fmt: skip


def _in_step_order(rows) -> list[float]:
    """Wall times of (step, kind, wall) rows in step order, a step's training before its evaluation."""
    return [wall for _, _, wall in sorted(rows, key=lambda row: (int(row[0]), row[1] != "train"))]


def _walls(run: Run) -> list[float]:
    return _in_step_order(MetricRow.objects.filter(run=run).values_list("step", "kind", "wall_time"))


def _increasing(walls: list[float]) -> bool:
    return all(a < b for a, b in zip(walls, walls[1:], strict=False))


@pytest.fixture
def stopped_run(user):
    """A run of two steps that stopped after its first, checkpointed there (as a cancelled one does)."""
    cfg = get_preset("cpu").with_overrides(**TINY).to_dict()
    run = Run.objects.create(name="stopped", owner=user, method=cfg["method"], env=cfg["env"], config=cfg)
    run_training(run, extra_reporters=[Recorder(stop_after=1)])
    yield Run.objects.get(pk=run.pk)
    for folder in {run_dir(r) for r in Run.objects.filter(owner=user)}:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_run_resumed_in_place_goes_on_from_its_checkpoints_wall_time_in_its_rows_and_exports(
    stopped_run, tmp_path
):
    saved = read_checkpoint(stopped_run.checkpoint_dir).elapsed_s
    before = _walls(stopped_run)  # evaluation 0, step 1, evaluation 1
    assert len(before) == 3 and before[-1] <= saved
    env = stopped_run.environment
    assert env["resumed_at_steps"] == "never" and int(env["threads"]) >= 1

    run_training(stopped_run)  # what the supervisor does when a run's training process died
    stopped_run.refresh_from_db()
    assert stopped_run.environment["resumed_at_steps"] == "1"  # the conditions a report prints beside it
    first, second = stopped_run.environment["attempts"].split(",")
    commit = env["code_version"][:8]
    assert first == f"0@{commit}/{env['cpu']}/{env['threads']}" and second.startswith(f"1@{commit}/")
    walls = _walls(stopped_run)
    assert len(walls) == 5 and walls[:3] == before and walls[3] > saved
    assert _increasing(walls), walls

    call_command("export_run", str(stopped_run.pk), "--format", "csv", "--out", str(tmp_path / "m.csv"))
    with open(tmp_path / "m.csv") as f:
        rows = {(r["step"], r["kind"], float(r["wall_time"])) for r in csv.DictReader(f)}
    assert _in_step_order(rows) == walls
    call_command("export_run", str(stopped_run.pk), "--format", "tensorboard", "--out", str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = sorted(events.Scalars("train/success"), key=lambda e: e.step)
    assert [e.step for e in scalars] == [1, 2] and _increasing([e.wall_time for e in scalars])


def test_a_run_resumed_from_another_runs_checkpoint_goes_on_from_its_wall_time(stopped_run):
    saved = read_checkpoint(stopped_run.checkpoint_dir).elapsed_s
    resumed = run_resume(stopped_run, stopped_run.owner)  # the product's Resume: a new run
    run_training(resumed)
    walls = _walls(resumed)  # step 2, evaluation 2
    assert len(walls) == 2 and walls[0] > saved >= max(_walls(stopped_run))
    assert _increasing(walls), walls

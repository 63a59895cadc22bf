"""Runs trained by a real Celery worker process: rows, checkpoints, cancellation, readable failures."""

from __future__ import annotations

import io
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.conftest import wait_for
from trainer.config import get_preset
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.progress import Heartbeat
from webapp.services import run_cancel
from webapp.tasks import train_run
from webapp.training import run_dir

pytestmark = pytest.mark.django_db(transaction=True)


def _tiny(**overrides) -> dict:
    cfg = get_preset("cpu").with_overrides(
        method="grpo", tasks_per_step=1, k_rollouts=2, eval_every=0, checkpoint_every=1,
        **{"rollout.turn_limit": 2, "rollout.max_new_tokens": 12, "rollout.kv_cache_gib": 0.25}, **overrides,
    )  # fmt: skip
    return cfg.to_dict()


@pytest.fixture
def make_run(user):
    """Runs of a tiny config; their folders (checkpoints are large) are removed afterwards."""
    runs = []

    def make(**overrides) -> Run:
        cfg = _tiny(**overrides)
        runs.append(
            Run.objects.create(name="t", owner=user, method=cfg["method"], env=cfg["env"], config=cfg)
        )
        return runs[-1]

    yield make
    for run in runs:
        shutil.rmtree(run_dir(run), ignore_errors=True)


def test_a_run_trains_on_a_real_worker_and_records_rows_episodes_and_checkpoints(make_run, celery_worker):
    run = make_run(steps=2)
    assert train_run.apply_async(args=[run.id], queue=celery_worker).get(timeout=600) == "succeeded"
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.step == 2 and run.finished_at
    assert list(MetricRow.objects.filter(run=run, kind="train").values_list("step", flat=True)) == [1, 2]
    assert "train/success" in MetricRow.objects.get(run=run, step=2, kind="train").values
    assert EpisodeRecord.objects.filter(run=run).count() == 2 * 2  # steps × (tasks × K)
    assert sorted(p.name for p in Path(run.checkpoint_dir).glob("checkpoints/step-*"))[-1] == "step-000002"
    assert run.environment["code_version"] and run.environment["torch"].startswith("2.")
    log = (Path(run.checkpoint_dir) / "log.txt").read_text()
    assert "step 2/2" in log and "eval after step 2" in log  # the run page shows its tail
    # Delivered twice (acks_late): the second delivery finds the run taken and does nothing.
    assert train_run.apply_async(args=[run.id], queue=celery_worker).get(timeout=60).startswith("run")

    out = io.StringIO()
    args = ["--engine", "hf", "--episodes", "2", "--no-experience"]
    call_command("evaluate", run.checkpoint_dir, *args, stdout=out)
    assert "MiniHack-Room-5x5" in out.getvalue() and "success w/o" in out.getvalue()


def test_cancelling_a_running_run_stops_it_between_steps(make_run, celery_worker):
    run = make_run(steps=200)
    train_run.apply_async(args=[run.id], queue=celery_worker)
    wait_for(lambda: MetricRow.objects.filter(run=run).exists(), 600, "the first step")
    run_cancel(Run.objects.get(pk=run.pk))
    run = wait_for(lambda: Run.objects.filter(pk=run.pk, status=Run.Status.CANCELLED).first(), 900, "cancel")
    assert 1 <= run.step < 200 and run.finished_at


def test_a_bad_config_fails_with_a_readable_message(make_run, celery_worker):
    run = make_run(env="No-Such-Env")
    assert train_run.apply_async(args=[run.id], queue=celery_worker).get(timeout=120) == "failed"
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "No-Such-Env" in run.error.splitlines()[0]


def test_a_lost_run_is_claimed_again_and_a_live_one_is_not(make_run):
    run = make_run()
    assert run.claim("w1")
    assert not Run.objects.get(pk=run.pk).claim("w2")  # its worker beats: not lost
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    lost = Run.objects.get(pk=run.pk)
    assert lost.display_status == "lost"
    assert lost.claim("w2") and lost.worker == "w2" and lost.display_status == Run.Status.RUNNING


def test_manage_py_train_records_its_run_for_the_dashboard(user, tmp_path):
    out = io.StringIO()
    overrides = ["tasks_per_step=1", "k_rollouts=2", "eval_every=0", "checkpoint_every=1",
                 "rollout.engine=hf", "rollout.turn_limit=2", "rollout.max_new_tokens=8"]  # fmt: skip
    args = ["--config", "cpu", "--method", "grpo", "--steps", "1", "--owner", user.username]
    args += ["--out", tmp_path]
    call_command("train", *args, *[f"--set={o}" for o in overrides], stdout=out)
    run = Run.objects.get(owner=user)
    assert run.status == Run.Status.SUCCEEDED and run.step == 1 and run.checkpoint_dir == str(tmp_path)
    assert MetricRow.objects.filter(run=run, kind="train").count() == 1
    assert f"run {run.pk} succeeded" in out.getvalue() and "step 1/1" in out.getvalue()


def test_manage_py_train_refuses_an_unknown_owner_and_a_bad_override(user):
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("train", "--owner", "nobody", "--steps", "1")
    with pytest.raises(CommandError, match="k_rollouts"):
        call_command("train", "--owner", user.username, "--set", "k_rollouts=7")
    assert not Run.objects.exists()


def test_a_run_beats_between_steps_and_stops_beating_when_it_ends(make_run):
    run = make_run()
    old = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, heartbeat_at=old)
    with Heartbeat(run.pk, interval=0.05):
        wait_for(lambda: Run.objects.get(pk=run.pk).heartbeat_at > old, 10, "a beat")
        assert Run.objects.get(pk=run.pk).display_status == Run.Status.RUNNING
    Run.objects.filter(pk=run.pk).update(heartbeat_at=old)
    time.sleep(0.3)
    assert Run.objects.get(pk=run.pk).display_status == "lost"  # no beats after the end


def test_a_retried_run_forgets_what_its_interrupted_attempt_recorded_after_its_checkpoint(user):
    import numpy as np

    from experience import bank
    from webapp.training import rewind

    run = Run.objects.create(name="r", owner=user)
    for step in range(4):
        MetricRow.objects.create(run=run, step=step, wall_time=step, values={})
        EpisodeRecord.objects.create(run=run, step=step, task_instance=0, env="E", seed=0, guided=False,
                                     reward=0, success=False, num_actions=1)  # fmt: skip
    for step in (0, 1, 2, 3):
        bank.add(run.pk, "E", f"entry of step {step}", "text", np.ones(384) / np.sqrt(384),
                 embedding_model="m", step=step)  # fmt: skip
    rewind(run, 1)
    assert sorted(MetricRow.objects.filter(run=run).values_list("step", flat=True)) == [0, 1]
    assert sorted(EpisodeRecord.objects.filter(run=run).values_list("step", flat=True)) == [0, 1]
    assert sorted(run.experiences.values_list("created_step", flat=True)) == [0, 1]

"""Runs trained by a real Celery worker process: rows, checkpoints, cancellation, readable failures."""

from __future__ import annotations

import io
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from tests.conftest import wait_for, workers_running
from trainer.config import get_preset
from trainer.paths import var_dir
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.progress import Heartbeat, tree_rss_mb
from webapp.services import RunError, run_cancel, run_resume
from webapp.supervisor import MAX_RESTARTS
from webapp.tasks import requeue_lost_runs, train_run
from webapp.training import run_dir

pytestmark = pytest.mark.django_db(transaction=True)


TINY = {"method": "grpo", "tasks_per_step": 1, "k_rollouts": 2, "eval_every": 0, "checkpoint_every": 1,
        "rollout.turn_limit": 2, "rollout.max_new_tokens": 12, "rollout.kv_cache_gib": 0.25}  # fmt: skip


def _tiny(**overrides) -> dict:
    return get_preset("cpu").with_overrides(**(TINY | overrides)).to_dict()


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
    assert EpisodeRecord.objects.filter(run=run, kind="train").count() == 2 * 2  # steps × (tasks × K)
    n = run.config["eval_episodes"]  # per evaluation: grpo's one column, without experience
    evals = EpisodeRecord.objects.filter(run=run, kind="eval")
    assert sorted(evals.values_list("step", flat=True)) == [0] * n + [2] * n
    assert sorted(p.name for p in Path(run.checkpoint_dir).glob("checkpoints/step-*"))[-1] == "step-000002"
    assert run.environment["code_version"] and run.environment["torch"].startswith("2.")
    assert run.environment["cpu"] and run.environment["native_bf16"] in ("true", "false")
    log = (Path(run.checkpoint_dir) / "log.txt").read_text()
    assert "step 2/2" in log and "eval after step 2" in log  # the run page shows its tail
    # Delivered twice (acks_late): the second delivery finds the run taken and does nothing.
    assert train_run.apply_async(args=[run.id], queue=celery_worker).get(timeout=60).startswith("run")

    out = io.StringIO()
    args = ["--engine", "hf", "--episodes", "2", "--no-experience"]
    call_command("evaluate", run.checkpoint_dir, *args, stdout=out)
    assert "MiniHack-Room-5x5" in out.getvalue() and "success w/o" in out.getvalue()


def _worker_process(queue: str) -> psutil.Process:
    return next(p for p in psutil.process_iter(["cmdline"]) if queue in " ".join(p.info["cmdline"] or []))


def _settled_rss_mb(process: psutil.Process) -> float:
    """The process tree's memory once two readings 5 s apart agree within 2%."""
    before = tree_rss_mb(process)
    for _ in range(60):
        time.sleep(5)
        now = tree_rss_mb(process)
        if abs(now - before) < 0.02 * before:
            return now
        before = now
    raise AssertionError(f"the worker's memory did not settle ({before:.0f} MB)")


def _training_process(run: Run) -> psutil.Process | None:
    needle = f"train_claimed {run.pk}"
    found = (
        p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []).endswith(needle)
    )
    return next(found, None)


def test_cancelling_a_run_mid_rollout_stops_it_within_seconds_and_gives_the_memory_back(
    make_run, celery_worker
):
    worker = _worker_process(celery_worker)
    idle_mb = _settled_rss_mb(worker)  # after its start-up (the embedder loads in the background)
    # a long rollout (evaluation first, then training): a dark 15x15 room, 50 turns an episode, each turn one
    # short engine call (8 episodes, 8 tokens), so a cancel waits for at most one such call; the evaluation
    # outlasts the wait below (Room-5x5's 15 turns did not on a quiet machine: step 1 had finished)
    env = "MiniHack-Room-Dark-15x15"
    long = {"rollout.max_new_tokens": 8, "rollout.turn_limit": 50}
    run = make_run(steps=5, env=env, eval_episodes=8, **long)
    result = train_run.apply_async(args=[run.id], queue=celery_worker)
    evaluating = Run.objects.filter(pk=run.pk, progress__phase="evaluation")
    wait_for(evaluating.exists, 600, "the step-0 evaluation")
    time.sleep(5)  # inside the evaluation's rollout, past the engine's first (slower) calls
    assert not MetricRow.objects.filter(run=run).exists(), "the evaluation ended before the cancel"
    asked = time.monotonic()
    run_cancel(Run.objects.get(pk=run.pk))
    run = wait_for(lambda: Run.objects.filter(pk=run.pk, status=Run.Status.CANCELLED).first(), 60, "cancel")
    took = time.monotonic() - asked
    assert took < 15, f"cancelled after {took:.1f} s"
    assert result.get(timeout=60) == Run.Status.CANCELLED
    assert run.step == 0 and not MetricRow.objects.filter(run=run, kind="train").exists()
    assert run.peak_rss_mb and run.peak_rss_mb > 500  # the training process's peak, engines included
    wait_for(lambda: _training_process(run) is None, 30, "the training process to exit")
    after_mb = _settled_rss_mb(worker)
    assert after_mb < 1.1 * idle_mb, f"worker at {after_mb:.0f} MB after the run, {idle_mb:.0f} MB idle"


def test_a_killed_training_process_is_resumed_by_itself_and_each_step_is_recorded_once(
    make_run, celery_worker
):
    run = make_run(steps=3)
    result = train_run.apply_async(args=[run.id], queue=celery_worker)
    wait_for(lambda: MetricRow.objects.filter(run=run, kind="train", step=1).exists(), 600, "step 1")
    first = wait_for(lambda: _training_process(run), 30, "the training process")
    first.send_signal(signal.SIGKILL)  # in step 2 (or step 1's checkpoint): either way mid-run
    assert result.get(timeout=900) == Run.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.step == 3 and run.restarts == 1
    assert "SIGKILL" in run.notice and "resumed" in run.notice
    steps = list(
        MetricRow.objects.filter(run=run, kind="train").order_by("step").values_list("step", flat=True)
    )
    assert steps == [1, 2, 3]  # each step once: the interrupted attempt's rows after its checkpoint are gone
    walls = list(
        MetricRow.objects.filter(run=run, kind="train").order_by("step").values_list("wall_time", flat=True)
    )
    assert walls == sorted(set(walls))  # wall time went on from the checkpoint's, not from 0
    assert EpisodeRecord.objects.filter(run=run, kind="train").count() == 3 * 2
    # the evaluations of the untrained model and of the end, once each, however far the killed attempt got
    n = run.config["eval_episodes"]
    assert (
        sorted(EpisodeRecord.objects.filter(run=run, kind="eval").values_list("step", flat=True))
        == [0] * n + [3] * n
    )


def test_a_run_whose_claiming_process_is_gone_is_claimed_at_once_and_requeued_by_the_sweep(make_run):
    gone = subprocess.Popen(["true"])
    gone.wait()
    run = make_run()
    assert run.claim(f"w1@{socket.gethostname()}:{gone.pid}")
    run = Run.objects.get(pk=run.pk)
    assert run.display_status == "lost"  # its heartbeat is fresh, but no process holds it
    assert requeue_lost_runs() == [run.pk]
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.restarts == 1 and "put back on the queue" in run.notice
    assert run.claim("w2")  # a queued run again
    Run.objects.filter(pk=run.pk).update(
        restarts=MAX_RESTARTS, heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    assert requeue_lost_runs() == []
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "resumed 3 times" in run.error_summary


def test_resume_is_offered_only_when_a_checkpoint_exists(make_run, tmp_path):
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED, checkpoint_dir=str(tmp_path))
    run.refresh_from_db()
    assert run.checkpoint_source == ""
    with pytest.raises(RunError, match="no checkpoint"):
        run_resume(run, run.owner)
    (tmp_path / "checkpoints" / "step-000002.partial").mkdir(parents=True)  # a save cut short
    assert Run.objects.get(pk=run.pk).checkpoint_source == ""
    (tmp_path / "checkpoints" / "step-000001").mkdir()
    (tmp_path / "checkpoints" / "step-000001" / "state.json").write_text("{}")
    assert Run.objects.get(pk=run.pk).checkpoint_source == str(tmp_path)


def test_a_bad_config_fails_with_a_readable_message(make_run, celery_worker):
    run = make_run(env="No-Such-Env")
    assert train_run.apply_async(args=[run.id], queue=celery_worker).get(timeout=120) == "failed"
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and "No-Such-Env" in run.error.splitlines()[0]


def test_two_real_workers_racing_for_the_same_runs_train_each_once_and_the_loser_says_so(make_run):
    """Two Celery worker processes on one training queue, each run's task sent twice (a redelivery, a
    double submit): each copy goes to a free worker at once (prefetch 1), so the two race to claim it; the
    run trains once (its bad env fails it fast); the loser logs that it did not claim it, takes the next."""
    queue = f"race-{uuid.uuid4().hex[:8]}"
    commands = [[sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", queue, "--pool", "solo",
                 "--hostname", f"{queue}-{i}@%h", "--loglevel", "INFO", "--without-gossip",
                 "--without-mingle"] for i in (1, 2)]  # fmt: skip
    runs = [make_run(env="No-Such-Env") for _ in range(3)]
    with workers_running(commands) as nodes:
        sent = {run.pk: [train_run.apply_async(args=[run.pk], queue=queue) for _ in range(2)] for run in runs}
        outcomes = {pk: sorted(copy.get(timeout=300) for copy in copies) for pk, copies in sent.items()}
        logs = [(var_dir() / f"celery-{node.split('@')[0]}.log").read_text() for node in nodes]
    for run in runs:
        trained, lost = outcomes[run.pk]
        run.refresh_from_db()
        assert trained == "failed" and run.status == Run.Status.FAILED, outcomes
        # the loser says what it found: the run ended, or the winner's name
        assert re.fullmatch(rf"run {run.pk} not claimed: (failed|running by {queue}-[12]@\S+:\d+)", lost), (
            lost
        )
        assert sum(f"run {run.pk} not claimed: " in log for log in logs) == 1, logs  # in its log
        assert f"run {run.pk} not claimed: queued" not in "".join(logs)  # what it found, not what it read


def test_a_lost_run_is_claimed_again_and_a_live_one_is_not(make_run):
    run = make_run()
    assert run.claim("w1")
    assert not Run.objects.get(pk=run.pk).claim("w2")  # its worker beats: not lost
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    lost = Run.objects.get(pk=run.pk)
    assert lost.display_status == "lost"
    assert lost.claim("w2") and lost.worker == "w2" and lost.display_status == Run.Status.RUNNING


def _claim_at_once(runs: list[Run], workers: tuple[str, ...]) -> dict[int, list[str]]:
    """Every worker claims every run, all workers at the same moment (one thread and database connection
    each, released together by a barrier): who got each run."""
    barrier, got = threading.Barrier(len(workers)), {run.pk: [] for run in runs}

    def claims(worker: str) -> None:
        try:
            for run in runs:
                barrier.wait(timeout=30)
                if Run.objects.get(pk=run.pk).claim(worker):
                    got[run.pk].append(worker)
        finally:
            connection.close()

    threads = [threading.Thread(target=claims, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return got


def test_two_workers_claiming_the_same_runs_at_the_same_moment_get_each_run_once(make_run):
    queued = [make_run() for _ in range(30)]
    got = _claim_at_once(queued, ("w1@a:1", "w2@b:2"))
    assert all(len(who) == 1 for who in got.values()), got
    for run in queued:
        assert Run.objects.get(pk=run.pk).worker == got[run.pk][0]
    Run.objects.filter(pk__in=got).update(heartbeat_at=timezone.now() - timedelta(hours=1))  # all lost
    again = _claim_at_once(queued, ("w3@c:3", "w4@d:4"))
    assert all(len(who) == 1 for who in again.values()), again  # a lost run, too, is taken once


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
    assert Run.objects.get(pk=run.pk).peak_rss_mb > 50  # this process's memory, written when it ends
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

"""A group that cannot hang or double-train (issue 47, point 5): the supervisor ends a torchrun group whose
rank is stopped, or whose step stops moving, past the collective timeout, and says which rank and how long;
and no claim takes a run while a process of its last group still lives on this host, whatever its
heartbeat says. Real processes stand for torchrun and its ranks (each rank in a session of its own, as
torchrun starts them); a real 2-process gloo group times out in tests/trainer/test_parallel_group.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import psutil
import pytest
from django.utils import timezone

from trainer.config import RunConfig, get_preset
from webapp.models import Run
from webapp.supervisor import COLLECTIVE_TIMEOUT_S, ExitCode, record_processes, restart, supervise_group
from webapp.tasks import requeue_lost_runs

pytestmark = pytest.mark.django_db

STAND_IN = """
import os, subprocess, sys
ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                          env=os.environ | {"RANK": str(r)}) for r in range(2)]
print(" ".join(str(r.pid) for r in ranks), flush=True)
sys.exit(max(r.wait() for r in ranks))
"""
"""torchrun as the supervisor sees it: a session leader whose two ranks each lead a session of their own."""


@pytest.fixture
def run(user) -> Run:
    config = get_preset("cpu").with_overrides(nproc=2).to_dict()
    return Run.objects.create(name="g", owner=user, method="grpo", config=config, status=Run.Status.RUNNING)


@pytest.fixture
def group():
    proc = subprocess.Popen(
        [sys.executable, "-c", STAND_IN], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    ranks = [psutil.Process(int(pid)) for pid in proc.stdout.readline().split()]
    yield proc, ranks
    for p in [proc, *ranks]:
        if psutil.pid_exists(p.pid):
            p.kill()
    proc.wait()


def _gone(ranks: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)


def test_a_stopped_rank_ends_the_group_past_the_collective_timeout_and_the_notice_names_it(run, group):
    proc, ranks = group
    ranks[0].send_signal(signal.SIGSTOP)
    began = time.monotonic()
    code = supervise_group(proc, run.pk, timeout_s=3.0)
    took = time.monotonic() - began
    assert 3.0 < took < 12.0, f"ended after {took:.1f} s"
    assert code == -signal.SIGKILL and "rank 0 was stopped" in code.why and "every rank was ended" in code.why
    assert _gone(ranks), "every rank, the stopped one included, is gone"
    run.refresh_from_db()
    recorded = {pid for pid, _ in run.processes["pids"]}
    assert recorded == {proc.pid, *(p.pid for p in ranks)}
    assert restart(run, code)
    run.refresh_from_db()
    assert run.notice.startswith("The training process stopped answering: rank 0 was stopped (SIGSTOP")
    assert "resumed from the last checkpoint" in run.notice and run.restarts == 1


@pytest.mark.django_db(transaction=True)  # the thread's steps must reach the supervisor's connection
def test_a_group_whose_step_stops_moving_is_ended_and_one_that_moves_is_not(run, group):
    proc, ranks = group
    moving = threading.Event()

    def step_on() -> None:  # rank 0 reports a step every half second for 6 s, then nothing
        from django.db import connection

        for step in range(1, 13):
            Run.objects.filter(pk=run.pk).update(step=step)
            time.sleep(0.5)
        moving.set()
        connection.close()

    writer = threading.Thread(target=step_on)
    began = time.monotonic()
    writer.start()
    code = supervise_group(proc, run.pk, timeout_s=2.0, grace_s=1.0)
    took = time.monotonic() - began
    writer.join()
    assert moving.is_set() and 6.0 < took < 15.0, f"ended after {took:.1f} s"
    assert "no step progressed for 3 s" in code.why and _gone(ranks)


def test_a_cancelled_group_is_stopped_with_every_rank(run, group):
    proc, ranks = group
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    code = supervise_group(proc, run.pk, timeout_s=600.0)
    assert code.why == "" and _gone(ranks)


def test_a_claim_waits_while_a_process_of_the_last_group_lives_however_stale_its_heartbeat(run):
    rank = subprocess.Popen(["sleep", "600"])
    try:
        record_processes(run.pk, [psutil.Process(rank.pid)])
        rank.send_signal(signal.SIGSTOP)  # stopped, not answering: still a live rank of the old group
        Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        stale = Run.objects.get(pk=run.pk)
        assert stale.group_is_alive and not stale.claim("w2")
        assert not stale.is_lost and requeue_lost_runs() == []  # not put back on a queue no claim can take
        assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING and stale.worker == ""
    finally:
        rank.kill()
        rank.wait()
    gone = Run.objects.get(pk=run.pk)
    assert not gone.group_is_alive and gone.claim("w2") and gone.worker == "w2"


def test_a_recorded_pid_given_to_a_later_process_does_not_hold_the_run(run):
    Run.objects.filter(pk=run.pk).update(
        heartbeat_at=timezone.now() - timedelta(hours=1),
        processes={"host": os.uname().nodename, "pids": [[os.getpid(), 1.0]]},  # this pid, another start
    )
    assert Run.objects.get(pk=run.pk).claim("w2")


def test_another_hosts_group_is_left_to_its_heartbeat(run):
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        started = psutil.Process(sleeper.pid).create_time()  # alive, but named as another host's
        Run.objects.filter(pk=run.pk).update(
            heartbeat_at=timezone.now(), processes={"host": "elsewhere", "pids": [[sleeper.pid, started]]}
        )
        assert not Run.objects.get(pk=run.pk).claim("w2")  # its heartbeat is fresh
        Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        assert Run.objects.get(pk=run.pk).claim("w2")  # stale there: the only sign another host gives
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_supervisors_default_collective_timeout_is_the_configs():
    assert RunConfig().collective_timeout_s == COLLECTIVE_TIMEOUT_S


def test_a_notice_after_an_exit_names_the_checkpoint_it_resumes_from(run, tmp_path):
    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-000002" / "state.json").write_text("{}")
    (tmp_path / "checkpoints" / "step-000003.partial").mkdir()
    Run.objects.filter(pk=run.pk).update(checkpoint_dir=str(tmp_path), step=3)
    run.refresh_from_db()
    assert restart(run, ExitCode(1))
    run.refresh_from_db()
    assert "exited with code 1 at step 3; it was resumed from the last checkpoint at step 2" in run.notice

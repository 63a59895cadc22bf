"""A run with nproc 2 trained by a real Celery worker (issue 36): the supervisor starts a torchrun group,
ends and restarts the whole group when one rank stops answering (it resumes from the last checkpoint, each
metric row recorded once), and stops every rank within seconds of a cancel. A SIGKILLed rank's restart is
tests/e2e/test_two_process_browser.py's, on a complementary run launched from the browser. A tiny random
Llama stands in for SmolLM2 (two ranks of it, each with its engine, would crowd this box's memory)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for
from tests.trainer.tiny_models import tiny_llama_folder
from trainer.config import get_preset
from webapp.models import MetricRow, Run
from webapp.services import run_cancel
from webapp.tasks import train_run
from webapp.training import run_dir

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = {"method": "grpo", "nproc": 2, "tasks_per_step": 1, "k_rollouts": 4, "eval_every": 0,
         "eval_episodes": 2, "checkpoint_every": 1, "rollout.turn_limit": 3, "rollout.max_new_tokens": 8,
         "rollout.kv_cache_gib": 0.0625, "rollout.dtype": "float32"}  # fmt: skip

COMPLEMENTARY = {"method": "complementary", "steps": 3, "extractor.max_new_tokens": 48,
                 "extractor.buffer_size": 1, "extractor.micro_batch_size": 1, "experience.warmup_steps": 0,
                 "experience.merge_every": 1, "eval_every": 3}  # fmt: skip


@pytest.fixture
def make_run(user, tmp_path):
    model, runs = tiny_llama_folder(tmp_path / "tiny"), []

    def make(**overrides) -> Run:
        cfg = get_preset("cpu").with_overrides(**(SMALL | {"actor.model_path": str(model)} | overrides))
        runs.append(
            Run.objects.create(name="g", owner=user, method="grpo", env=cfg.env, config=cfg.to_dict())
        )
        return runs[-1]

    yield make
    for run in runs:
        shutil.rmtree(run_dir(run), ignore_errors=True)


def _ranks(run: Run, queue: str) -> list[psutil.Process] | None:
    """The group's two rank processes (not torchrun itself), or None while there are not two: descendants
    of the worker consuming ``queue``, as other test databases' runs (and leftovers) may have the same id."""
    needle = f"train_claimed {run.pk}"
    try:
        workers = [p for p in psutil.process_iter(["cmdline"]) if queue in (p.info["cmdline"] or [])]
        ranks = [
            p
            for w in workers
            for p in w.children(recursive=True)
            if " ".join(p.cmdline()).endswith(needle) and "torch.distributed.run" not in p.cmdline()
        ]
    except psutil.NoSuchProcess:
        return None
    return ranks if len(ranks) == 2 else None


def _status(run: Run) -> str:
    run = Run.objects.get(pk=run.pk)
    return f"{run.status} {run.error} {run.notice}"


def _worker_tree_rss(queue: str) -> int:
    """Resident bytes of the worker consuming ``queue`` and everything it started."""
    (worker,) = [p for p in psutil.process_iter(["cmdline"]) if queue in (p.info["cmdline"] or [])]
    return sum(p.memory_info().rss for p in [worker, *worker.children(recursive=True)])


def test_cancelling_a_two_process_run_stops_every_rank_within_seconds_and_frees_their_memory(
    make_run, celery_worker
):
    # "idle" is a worker that has supervised a group before (its imports and allocator arenas in place):
    # a first 2-process run, cancelled as soon as its ranks exist
    warm_up = make_run(steps=50)
    started = train_run.apply_async(args=[warm_up.id], queue=celery_worker)
    wait_for(lambda: _ranks(warm_up, celery_worker), 600, "the warm-up run's ranks")
    run_cancel(Run.objects.get(pk=warm_up.pk))
    assert started.get(timeout=120) == Run.Status.CANCELLED
    idle = _worker_tree_rss(celery_worker)
    run = make_run(steps=50, **{"rollout.turn_limit": 200})
    result = train_run.apply_async(args=[run.id], queue=celery_worker)
    ranks = wait_for(lambda: _ranks(run, celery_worker), 600, "both ranks")
    time.sleep(20)  # the ranks load, start their engines and roll out
    asked = time.monotonic()
    run_cancel(Run.objects.get(pk=run.pk))
    _, alive = psutil.wait_procs(ranks, timeout=60)
    took = time.monotonic() - asked
    assert not alive
    assert took < 15, f"every rank gone after {took:.1f} s"
    assert result.get(timeout=60) == Run.Status.CANCELLED
    after = _worker_tree_rss(celery_worker)
    print(f"worker: {idle / 2**20:.0f} MiB idle, {after / 2**20:.0f} MiB after the cancel ({took:.1f} s)")
    assert after <= 1.1 * idle, f"worker: {after / 2**20:.0f} MiB after the cancel, {idle / 2**20:.0f} idle"


STOPPED_PEER = """
import os, signal, sys, time
import torch, torch.distributed as dist
from trainer.config import RunConfig
from trainer.parallel import init_distributed
placement = init_distributed("cpu", RunConfig(nproc=2, collective_timeout_s=5).collective_timeout_s)
dist.barrier()
if placement.rank == 0:
    os.kill(os.getpid(), signal.SIGSTOP)  # stops answering, as a rank under SIGSTOP or a debugger
time.sleep(0.5)
began = time.monotonic()
try:
    dist.all_reduce(torch.ones(1))
except Exception as exc:
    print(f"rank {placement.rank} gave up after {time.monotonic() - began:.1f} s: {exc}", flush=True)
    sys.exit(3)
print(f"rank {placement.rank} never gave up", flush=True)
"""


def test_a_collective_gives_up_on_a_stopped_rank_after_the_runs_collective_timeout(tmp_path):
    """Rank 0 stops itself; rank 1's all-reduce raises after collective_timeout_s (5 s here), not after
    gloo's default 30 minutes. (That torchrun then ends the group and the supervisor restarts it is the next
    test's; this one stops reading at rank 1's word rather than wait out torchrun's 30 s grace.)"""
    script = tmp_path / "stopped_peer.py"
    script.write_text(STOPPED_PEER)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    group = subprocess.Popen([*launcher, str(script)], env=env, start_new_session=True, **output)
    watchdog = threading.Timer(240, lambda: os.killpg(group.pid, signal.SIGKILL))
    watchdog.start()
    lines: list[str] = []
    try:
        for line in group.stdout:
            lines.append(line)
            if line.startswith("rank 1 "):
                break
    finally:
        watchdog.cancel()
        ranks = psutil.Process(group.pid).children(recursive=True)  # torchrun's workers, killed one by one
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group.pid, signal.SIGKILL)
        for rank in ranks:  # the stopped rank outlived the group's kill once, orphaned, holding its memory
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
        group.wait()
    gave_up = [line for line in lines if line.startswith("rank 1 gave up after")]
    assert gave_up, "".join(lines)[-3000:]
    seconds = float(gave_up[0].split("after ")[1].split(" s:")[0])
    assert 4.0 <= seconds < 30.0 and "Timed out" in gave_up[0], gave_up[0]


def test_a_stopped_rank_ends_the_group_with_a_notice_and_the_run_resumes_from_its_checkpoint(
    make_run, celery_worker
):
    """Rank 0 stops answering (SIGSTOP) after step 1 of a 2-process run on a Celery worker: past the run's
    collective timeout the group is ended (every rank, the stopped one included), the notice names rank 0
    and the checkpoint, and the run resumes from it and finishes with each row once."""
    run = make_run(steps=3, collective_timeout_s=60)
    result = train_run.apply_async(args=[run.id], queue=celery_worker)
    saved = run_dir(run) / "checkpoints" / "step-000001" / "state.json"
    wait_for(saved.exists, 900, "step 1's checkpoint")
    ranks = wait_for(lambda: _ranks(run, celery_worker), 60, "both ranks")
    (rank0,) = [p for p in ranks if p.environ().get("RANK") == "0"]
    held = {pid for pid, _ in Run.objects.get(pk=run.pk).processes["pids"]}
    assert {p.pid for p in ranks} <= held  # the supervisor recorded the group: no claim while one lives
    rank0.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    assert not Run.objects.get(pk=run.pk).claim("another worker")
    _, alive = psutil.wait_procs(ranks, timeout=300)
    took = time.monotonic() - stopped
    assert not alive and took < 150, f"the group ended {took:.0f} s after rank 0 stopped"
    assert result.get(timeout=1200) == Run.Status.SUCCEEDED, _status(run)
    run.refresh_from_db()
    assert run.restarts == 1 and "stopped answering: rank 0 was stopped" in run.notice, run.notice
    assert "resumed from the last checkpoint at step 1 (restart 1 of 3)" in run.notice, run.notice
    steps = list(MetricRow.objects.filter(run=run, kind="train").values_list("step", flat=True))
    assert sorted(steps) == [1, 2, 3]

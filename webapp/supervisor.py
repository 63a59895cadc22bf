"""A run trains in a child process of its own, watched by a light supervisor (the Celery task, or the
experiment runner), which never loads torch:

- memory: the child holds the models and the engines; when the run ends, it exits and all of it goes back,
  so the worker returns to its idle footprint after every run;
- crash recovery: a child that dies (a signal, out of memory, a crash in native code) while its run is
  still running is started again and resumes from the run's last checkpoint (the steps after it are redone,
  each recorded once), at most ``MAX_RESTARTS`` times; then the run fails with the reason;
- the child runs at a lower CPU priority (``STUDIO_TRAINING_NICE``): on a machine that also serves the
  pages, a request never waits behind a training step for a core;
- the child dies with its supervisor (``PR_SET_PDEATHSIG``), so a task redelivered after its worker died
  never meets an orphan still training, and claims the run at once (``Run.holder_is_gone``);
- a run whose config asks for ``nproc`` above 1 trains in a torchrun group instead (``torch.distributed.run``
  starting that many ranks of the same command, in a session of its own): a rank that dies makes torchrun
  stop the others and exit non-zero, so the whole group is started again and resumes like one child; a
  cancelled run's group is stopped from here (SIGTERM to every rank, SIGKILL after ``STOP_GRACE_S``), since
  ranks waiting in a collective for the one that stopped would never look at the token.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.db import connection
from django.db.models import F

from webapp import dbpool
from webapp.models import Run

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
"""Times a run's training process may die and be resumed before the run fails."""
STOP_GRACE_S = 8.0
"""Seconds a cancelled torchrun group has between SIGTERM and SIGKILL."""


def holder_name(worker: str) -> str:
    """``<worker>@<host>:<pid>`` of this process: who holds a claimed run."""
    return f"{worker.split('@')[0]}@{socket.gethostname()}:{os.getpid()}"


def claim_and_train(run: Run, *, worker: str) -> str:
    """Claim ``run`` for ``worker`` and train it in supervised child processes: its final status, or a note
    when another worker has it."""
    if not run.claim(holder_name(worker)):
        return f"run {run.pk} not claimed: {run.status}"
    while True:
        code = train_in_child(run.pk, nproc=int(run.config.get("nproc", 1)))
        run.refresh_from_db()
        if run.status != Run.Status.RUNNING or not restart(run, code):
            return run.status


def exit_reason(code: int) -> str:
    """How a training process ended, as the middle of a sentence ("The training process ..."): a SIGKILL
    says its usual cause, since that is what a person can act on."""
    if code >= 0:
        return f"exited with code {code}"
    if -code == signal.SIGKILL:
        return "was killed (SIGKILL: most often the machine ran out of memory, or someone stopped it)"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was stopped by {name}"


def restart(run: Run, code: int) -> bool:
    """The child ended with ``run`` still running: record why and say whether to start it again."""
    why = exit_reason(code)
    if run.cancel_requested:
        run.finish(Run.Status.CANCELLED, f"The training process {why} while it was being cancelled.")
        return False
    if run.restarts >= MAX_RESTARTS:
        run.mark_failed(
            f"The training process stopped {run.restarts + 1} times; the last time it {why} at step "
            f"{run.step}. If memory ran out, clone the run with a lower tasks_per_step, k_rollouts or "
            "rollout.kv_cache_gib; otherwise fix the cause and press Resume from checkpoint. The worker's "
            "log says more."
        )
        return False
    notice = (
        f"The training process {why} at step {run.step}; it was resumed from the last checkpoint "
        f"(restart {run.restarts + 1} of {MAX_RESTARTS})."
    )
    Run.objects.filter(pk=run.pk).update(restarts=F("restarts") + 1, notice=notice)
    log.warning("run %s: %s", run.pk, notice)
    run.refresh_from_db()
    return True


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
"""Loaded here, not in the forked child: a fork while another thread holds the loader lock could hang."""
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.nice(settings.STUDIO_TRAINING_NICE)


def train_in_child(run_id: int, nproc: int = 1) -> int:
    """Train the claimed run ``run_id`` in a child process (``manage.py train_claimed``), or in a torchrun
    group of ``nproc`` of them; its exit code."""
    env = os.environ | {  # the child works on this process's database and result folder
        "STUDIO_DB_NAME": connection.settings_dict["NAME"],
        "STUDIO_EXPERIMENT_RESULTS": str(settings.EXPERIMENT_RESULTS_DIR),
    }
    env |= dbpool.role_env("training")  # its threads each keep a connection: a pool of its own size
    command = [str(settings.BASE_DIR / "manage.py"), "train_claimed", str(run_id)]
    preexec = _die_with_parent if _LIBC is not None else None
    options = {"cwd": settings.BASE_DIR, "env": env, "preexec_fn": preexec}  # fork-safe: see _LIBC
    if nproc == 1:
        return subprocess.run([sys.executable, *command], **options).returncode
    group = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    env |= {"OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen([*group, *command], start_new_session=True, **options)
    return _supervise_group(proc, run_id)


def _supervise_group(proc: subprocess.Popen, run_id: int) -> int:
    """Wait for a torchrun group; stop every rank once the run is cancelled. Its exit code."""
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        if Run.objects.filter(pk=run_id, cancel_requested=True).exists():
            return _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> int:
    """SIGTERM to the group's session (torchrun and every rank), SIGKILL to what is left after the grace."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group_alive(proc.pid):
            time.sleep(0.2)
        if not _group_alive(proc.pid):
            break
    return proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True

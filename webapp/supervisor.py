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
  never meets an orphan still training, and claims the run at once (``Run.holder_is_gone``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys

from django.conf import settings
from django.db import connection
from django.db.models import F

from webapp.models import Run

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
"""Times a run's training process may die and be resumed before the run fails."""


def holder_name(worker: str) -> str:
    """``<worker>@<host>:<pid>`` of this process: who holds a claimed run."""
    return f"{worker.split('@')[0]}@{socket.gethostname()}:{os.getpid()}"


def claim_and_train(run: Run, *, worker: str) -> str:
    """Claim ``run`` for ``worker`` and train it in supervised child processes: its final status, or a note
    when another worker has it."""
    if not run.claim(holder_name(worker)):
        return f"run {run.pk} not claimed: {run.status}"
    while True:
        code = train_in_child(run.pk)
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
        f"The training process {why} at step {run.step}; it was started again from the last checkpoint "
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


def train_in_child(run_id: int) -> int:
    """Train the claimed run ``run_id`` in a child process (``manage.py train_claimed``); its exit code."""
    env = os.environ | {  # the child works on this process's database and result folder
        "STUDIO_DB_NAME": connection.settings_dict["NAME"],
        "STUDIO_EXPERIMENT_RESULTS": str(settings.EXPERIMENT_RESULTS_DIR),
    }
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "train_claimed", str(run_id)]
    preexec = _die_with_parent if _LIBC is not None else None
    return subprocess.run(command, cwd=settings.BASE_DIR, env=env, preexec_fn=preexec).returncode  # noqa: PLW1509

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
  ranks waiting in a collective for the one that stopped would never look at the token;
- a group that stops answering is ended from here too (``GroupWatch``): a rank stopped (SIGSTOP) for longer
  than the run's ``collective_timeout_s``, or no step progress for that long plus ``STALL_GRACE_S``, and
  every rank is killed; the run resumes from its last checkpoint with a notice that says which rank and how
  long. The supervisor records the group's processes on the run (``Run.processes``) so that no other group
  claims it while one of them lives, and beats the run's heartbeat while it watches (docs/design.md §7).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from webapp import dbpool
from webapp.models import HEARTBEAT_INTERVAL_S, Run, last_checkpoint_step

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
"""Times a run's training process may die and be resumed before the run fails."""
STOP_GRACE_S = 8.0
"""Seconds a cancelled torchrun group has between SIGTERM and SIGKILL."""
COLLECTIVE_TIMEOUT_S = 3600.0
"""``RunConfig.collective_timeout_s``'s default, for runs whose config predates it (the supervisor never
loads torch, so it does not import the config)."""
STALL_GRACE_S = 60.0
"""How much longer than the collective timeout a group may show no step progress before its supervisor
ends it: by then every live rank's collective has given up, so the group hangs where no collective sees."""


class ExitCode(int):
    """A training process's exit code, with what its supervisor saw of its end (``why``: the middle of a
    sentence, like ``exit_reason``'s; "" when it ended by itself for no reason the supervisor saw)."""

    why = ""

    @classmethod
    def saying(cls, code: int, why: str) -> ExitCode:
        ended = cls(code)
        ended.why = why
        return ended


def holder_name(worker: str) -> str:
    """``<worker>@<host>:<pid>`` of this process: who holds a claimed run."""
    return f"{worker.split('@')[0]}@{socket.gethostname()}:{os.getpid()}"


class RunWaits(Exception):
    """The worker may not start the run yet (the message says why); its task is to come back later."""


def claim_and_train(run: Run, *, worker: str, admit: Callable[[], str | None] = lambda: None) -> str:
    """Claim ``run`` for ``worker`` and train it in supervised child processes: its final status, or a note
    when another worker has it. ``admit``, called in the claim's transaction: why the run must wait
    (raised as ``RunWaits``), or None."""
    with transaction.atomic():
        why = admit()
        claimed = why is None and run.claim(holder_name(worker))
    if why is not None:
        raise RunWaits(why)
    if not claimed:
        return not_claimed(run)
    while True:
        code = train_in_child(run.pk, nproc=int(run.config.get("nproc", 1)))
        run.refresh_from_db()
        if run.status != Run.Status.RUNNING or not restart(run, code):
            return run.status


def not_claimed(run: Run) -> str:
    """What a worker that lost ``run`` (another claimed it first, or it ended) logs and returns."""
    run.refresh_from_db()
    held = f" by {run.worker}" if run.status == Run.Status.RUNNING and run.worker else ""
    why = f"run {run.pk} not claimed: {run.status}{held}"
    log.info("%s; taking the next run", why)
    return why


def exit_reason(code: int) -> str:
    """How a training process ended, as the middle of a sentence ("The training process ..."): a SIGKILL
    says its usual cause, since that is what a person can act on."""
    if getattr(code, "why", ""):
        return code.why
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
    if run.cancel_requested:  # not a failure: what the person asked for, however the process ended
        Run.objects.filter(pk=run.pk).update(notice=f"Cancelled as requested (the training process {why}).")
        run.finish(Run.Status.CANCELLED)
        return False
    if run.restarts >= MAX_RESTARTS:
        run.mark_failed(
            f"The training process stopped {run.restarts + 1} times; the last time it {why} at step "
            f"{run.step}. If memory ran out, clone the run with a lower tasks_per_step, k_rollouts or "
            "rollout.kv_cache_gib; otherwise fix the cause and press Resume from checkpoint. The worker's "
            "log says more."
        )
        return False
    saved = last_checkpoint_step(run.checkpoint_dir)
    at = f" at step {saved}" if saved is not None else ""
    notice = (
        f"The training process {why} at step {run.step}; it was resumed from the last checkpoint{at} "
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
        return subprocess.run([sys.executable, *command], **options).returncode  # it records itself
    group = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    env |= {"OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.Popen([*group, *command], start_new_session=True, **options)
    timeout_s = float(Run.objects.get(pk=run_id).config.get("collective_timeout_s", COLLECTIVE_TIMEOUT_S))
    return supervise_group(proc, run_id, timeout_s)


def record_processes(run_id: int, procs: list[psutil.Process]) -> None:
    """Write a group's processes on its run (``Run.processes``): a claim waits while one of them lives."""
    pids = [[p.pid, p.create_time()] for p in procs]
    Run.objects.filter(pk=run_id).update(processes={"host": socket.gethostname(), "pids": pids})


def supervise_group(
    proc: subprocess.Popen, run_id: int, timeout_s: float, grace_s: float = STALL_GRACE_S
) -> ExitCode:
    """Wait for a torchrun group (``proc``, the leader of its own session); stop every rank once the run
    is cancelled, or once the group stops answering (``GroupWatch``). Its exit code, and why it ended."""
    watch = GroupWatch(proc, run_id, timeout_s, grace_s)
    while True:
        try:
            return ExitCode.saying(proc.wait(timeout=1.0), watch.ended_by_itself())
        except subprocess.TimeoutExpired:
            pass
        cancel, step, progress = Run.objects.filter(pk=run_id).values_list(
            "cancel_requested", "step", "progress"
        )[0]
        if cancel:
            return ExitCode(_stop_group(proc, watch.pids(), STOP_GRACE_S))
        if why := watch.look(step, progress):
            log.warning("run %s: the training group %s", run_id, why)
            return ExitCode.saying(_stop_group(proc, watch.pids(), 0.0), why)


class GroupWatch:
    """What a supervisor sees of its torchrun group, once a second: its processes (recorded on the run),
    each rank's state, and when the run's step or progress last moved (docs/design.md §7)."""

    def __init__(self, proc: subprocess.Popen, run_id: int, timeout_s: float, grace_s: float) -> None:
        self.proc, self.run_id, self.timeout_s, self.grace_s = proc, run_id, timeout_s, grace_s
        self.ranks: dict[int, psutil.Process] = {}
        self.stopped: dict[int, float] = {}  # rank -> when it was first seen stopped
        self.mark: tuple = ()
        self.moved = self.beaten = time.monotonic()
        with contextlib.suppress(psutil.Error):
            record_processes(run_id, [psutil.Process(proc.pid)])

    def pids(self) -> list[int]:
        """torchrun's and every rank's, looked up again: a rank started since the last look is stopped too."""
        self._see_ranks(time.monotonic())
        return [self.proc.pid, *(p.pid for p in self.ranks.values())]

    def look(self, step: int, progress: dict) -> str:
        """Why the group must be ended now, as the middle of a sentence; "" while it answers."""
        now = time.monotonic()
        if (step, progress) != self.mark:
            self.mark, self.moved = (step, progress), now
        self._see_ranks(now)
        if now - self.beaten >= HEARTBEAT_INTERVAL_S:  # the group is watched: the run is not lost
            Run.objects.filter(pk=self.run_id, status=Run.Status.RUNNING).update(heartbeat_at=timezone.now())
            self.beaten = now
        if any(now - since > self.timeout_s for since in self.stopped.values()):
            return (
                f"stopped answering: {self._stopped_words(now)}, past the collective timeout "
                f"({self.timeout_s:.0f} s, collective_timeout_s), so every rank was ended"
            )
        if now - self.moved > self.timeout_s + self.grace_s:
            return (
                f"stopped answering: no step progressed for {now - self.moved:.0f} s, past the collective "
                f"timeout ({self.timeout_s:.0f} s, collective_timeout_s), so every rank was ended"
            )
        return ""

    def ended_by_itself(self) -> str:
        """Why a group that exited by itself did, when a rank was seen stopped: its peers' collectives gave
        up on it."""
        if not self.stopped or self.proc.returncode == 0:
            return ""
        words = self._stopped_words(time.monotonic())
        return (
            f"stopped answering: {words}, and the other ranks' collectives gave up on it after the "
            f"collective timeout ({self.timeout_s:.0f} s, collective_timeout_s)"
        )

    def _stopped_words(self, now: float) -> str:
        rank, since = min(self.stopped.items(), key=lambda item: item[1])
        return f"rank {rank} was stopped (SIGSTOP or a debugger) for {now - since:.0f} s"

    def _see_ranks(self, now: float) -> None:
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return
        known = {p.pid for p in self.ranks.values()}
        for child in children:
            try:
                if child.pid not in known:
                    self.ranks[int(child.environ().get("RANK", -1))] = child
                state = child.status()
            except (psutil.Error, ValueError):
                continue
            rank = next(r for r, p in self.ranks.items() if p.pid == child.pid)
            if state in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                self.stopped.setdefault(rank, now)
            else:
                self.stopped.pop(rank, None)
        if {p.pid for p in self.ranks.values()} != known:
            record_processes(self.run_id, [psutil.Process(self.proc.pid), *self.ranks.values()])


def _stop_group(proc: subprocess.Popen, pids: list[int], grace: float) -> int:
    """SIGTERM to the group's sessions (torchrun's and each rank's: torchrun starts every rank in a session
    of its own), SIGKILL to what is left after ``grace`` seconds (at once with no grace)."""
    steps = ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)) if grace else ((signal.SIGKILL, 5.0),)
    for sig, wait in steps:
        for pgid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _any_alive(proc, pids):
            time.sleep(0.2)
        if not _any_alive(proc, pids):
            break
    return proc.wait()


def _any_alive(proc: subprocess.Popen, pids: list[int]) -> bool:
    """A process of the group's sessions lives (torchrun, once it exits, is reaped here)."""
    proc.poll()
    for pgid in pids:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            continue
        return True
    return False

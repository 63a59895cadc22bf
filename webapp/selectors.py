"""Reads for views and consumers. Every read of a run goes through ``Run.objects.visible_to(user)``."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import F, FloatField, OuterRef, Q, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.shortcuts import get_object_or_404

from webapp import charts
from webapp.models import EpisodeRecord, MetricRow, Run, RunQuerySet

RUN_SORTS = {
    "created": "-created_at",
    "oldest": "created_at",
    "name": "name",
    "step": "-step",
    "status": "status",
    "success": F("latest_success").desc(nulls_last=True),
}
WORKER_CACHE_S = 10
"""The worker indicator pings Celery at most this often (a ping waits for its timeout when none answer)."""


def run_list(user, *, filters: dict[str, Any] | None = None, sort: str = "created") -> RunQuerySet:
    """Runs the user may see, with their latest train success, filtered and sorted."""
    filters = filters or {}
    latest = (
        MetricRow.objects.filter(run=OuterRef("pk"), kind=MetricRow.Kind.TRAIN)
        .order_by("-step")
        .annotate(success=Cast(KeyTextTransform("success", "values"), FloatField()))
        .values("success")[:1]
    )
    qs = Run.objects.visible_to(user).select_related("owner").annotate(latest_success=Subquery(latest))
    if filters.get("status"):
        qs = qs.filter(status=filters["status"])
    if filters.get("method"):
        qs = qs.filter(method=filters["method"])
    if filters.get("env"):
        qs = qs.filter(env=filters["env"])
    if filters.get("tag"):
        qs = qs.filter(tags__contains=[filters["tag"]])
    if filters.get("q"):
        qs = qs.filter(Q(name__icontains=filters["q"]) | Q(env__icontains=filters["q"]))
    if filters.get("mine"):
        qs = qs.filter(owner=user)
    order = RUN_SORTS.get(sort, RUN_SORTS["created"])
    return qs.order_by(order, "-id")


def run_visible(user, run_id: int) -> bool:
    return user.is_authenticated and Run.objects.visible_to(user).filter(pk=run_id).exists()


def run_get(user, run_id: int) -> Run:
    """The run if this user may see it, else 404 (others' private runs do not exist for them)."""
    return get_object_or_404(Run.objects.visible_to(user).select_related("owner"), pk=run_id)


def runs_get(user, run_ids: list[int]) -> list[Run]:
    """The visible runs among ``run_ids``, in the order given (unknown or hidden ids are dropped)."""
    found = {r.id: r for r in Run.objects.visible_to(user).filter(pk__in=run_ids).select_related("owner")}
    return [found[i] for i in dict.fromkeys(run_ids) if i in found]


def worker_status() -> dict[str, Any]:
    """Celery workers answering a ping (cached a few seconds) and the number of queued runs."""
    workers = cache.get("studio:workers")
    if workers is None:
        from webapp.celery import app

        try:
            replies = app.control.inspect(timeout=0.5).ping() or {}
        except Exception:  # broker down: no worker can take a run either
            replies = {}
        workers = sorted(replies)
        cache.set("studio:workers", workers, WORKER_CACHE_S)
    return {"workers": workers, "queued": Run.objects.filter(status=Run.Status.QUEUED).count()}


# ---- metrics -------------------------------------------------------------------------------------


@dataclass
class Series:
    """One kind of metric rows of a run, maybe bucket-averaged: x columns and one column per key."""

    step: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    cursor: int = 0
    """Id of the newest row included: live updates continue after it."""
    bucket: int = 1

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "wall": self.wall, "values": self.values, "bucket": self.bucket}


def _keys(run_id: int, kind: str) -> list[str]:
    """Metric keys of a run's rows of one kind: those of its first and last rows."""
    rows = MetricRow.objects.filter(run_id=run_id, kind=kind)
    first = rows.order_by("step").values_list("values", flat=True).first() or {}
    last = rows.order_by("-step").values_list("values", flat=True).first() or {}
    merged = {**first, **last}
    return sorted(k for k, v in merged.items() if isinstance(v, (int, float)))


def metric_series(
    run_id: int, kind: str, *, max_points: int = charts.MAX_POINTS, bucket: int | None = None
) -> Series:
    """A run's metric rows of one kind, averaged per bucket of steps in the database so a browser gets at most
    ``max_points`` points however long the run (100k rows stay fast: one grouped index scan)."""
    keys = _keys(run_id, kind)
    if not keys:
        return Series()
    with connection.cursor() as cursor:
        if bucket is None:
            cursor.execute(
                "SELECT max(step) FROM webapp_metricrow WHERE run_id = %s AND kind = %s", [run_id, kind]
            )
            bucket = charts.bucket_size(cursor.fetchone()[0] or 0, max_points)
        columns = ", ".join(
            'avg(CASE WHEN jsonb_typeof("values"->%s) = \'number\' THEN ("values"->>%s)::float END)'
            for _ in keys
        )
        params: list[Any] = [k for key in keys for k in (key, key)]
        cursor.execute(
            f"SELECT max(id), max(step), max(wall_time), {columns} FROM webapp_metricrow "  # noqa: S608 - placeholders only
            "WHERE run_id = %s AND kind = %s GROUP BY step / %s ORDER BY 2",
            [*params, run_id, kind, bucket],
        )
        rows = cursor.fetchall()
    series = Series(bucket=bucket, values={k: [] for k in keys})
    for row in rows:
        series.cursor = max(series.cursor, row[0])
        series.step.append(row[1])
        series.wall.append(round(row[2], 3))
        for key, value in zip(keys, row[3:], strict=True):
            series.values[key].append(None if value is None else round(value, 6))
    return series


def run_metrics(run: Run, *, max_points: int = charts.MAX_POINTS) -> dict[str, Any]:
    """Everything the run page's charts start from: both kinds of series, the panels, the live cursor."""
    train = metric_series(run.id, MetricRow.Kind.TRAIN, max_points=max_points)
    evals = metric_series(run.id, MetricRow.Kind.EVAL, max_points=max_points)
    return {
        "series": {"train": train.as_json(), "eval": evals.as_json()},
        "panels": charts.panels_for({"train": train.values, "eval": evals.values}),
        "catalogue": charts.catalogue(),
        "cursor": max(train.cursor, evals.cursor),
    }


def metric_rows_since(run_id: int, cursor: int, limit: int = 5000) -> list[dict[str, Any]]:
    """Rows written after ``cursor`` (a row id) as live events, oldest first: a late subscriber's catch-up."""
    rows = MetricRow.objects.filter(run_id=run_id, id__gt=cursor).order_by("id")[:limit]
    return [metric_event(r) for r in rows]


def metric_event(row: MetricRow) -> dict[str, Any]:
    """The event a browser receives for one row (the same shape whether live or caught up)."""
    return {
        "kind": "metrics",
        "id": row.id,
        "metric_kind": row.kind,
        "step": row.step,
        "wall_time": row.wall_time,
        "values": row.values,
    }


def latest_values(run_id: int, kind: str) -> dict[str, Any]:
    row = (
        MetricRow.objects.filter(run_id=run_id, kind=kind).order_by("-step").values("step", "values").first()
    )
    return row or {"step": None, "values": {}}


# ---- traces and episodes -------------------------------------------------------------------------


def run_traces(run: Run, limit: int = 30) -> list[Any]:
    """The newest Search-and-Ask exchanges of the run (query, entry found, refined answer)."""
    from experience.models import SearchAsk

    return list(SearchAsk.objects.filter(run=run).select_related("experience").order_by("-id")[:limit])


def episode_steps(run: Run) -> list[int]:
    """Steps that have recorded episodes, newest first."""
    return list(
        EpisodeRecord.objects.filter(run=run).order_by("-step").values_list("step", flat=True).distinct()
    )


@dataclass
class TaskGroup:
    task_instance: int
    env: str
    seed: int
    guided: list[EpisodeRecord]
    free: list[EpisodeRecord]


def step_episodes(run: Run, step: int) -> list[TaskGroup]:
    """A step's episodes grouped by task instance, split into the guided and free subgroups."""
    groups: dict[int, TaskGroup] = {}
    for ep in EpisodeRecord.objects.filter(run=run, step=step).order_by("task_instance", "id"):
        group = groups.setdefault(ep.task_instance, TaskGroup(ep.task_instance, ep.env, ep.seed, [], []))
        (group.guided if ep.guided else group.free).append(ep)
    return list(groups.values())


# ---- comparison ----------------------------------------------------------------------------------


def compare_series(runs: list[Run], *, max_points: int = charts.MAX_POINTS) -> dict[int, dict[str, Series]]:
    """Each run's series of both kinds, bucketed with one bucket size so steps line up across runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, max(step) FROM webapp_metricrow WHERE run_id = ANY(%s) GROUP BY kind",
            [[r.id for r in runs]],
        )
        top = dict(cursor.fetchall())
    out: dict[int, dict[str, Series]] = defaultdict(dict)
    for run in runs:
        for kind in (MetricRow.Kind.TRAIN, MetricRow.Kind.EVAL):
            bucket = charts.bucket_size(top.get(kind, 0) or 0, max_points)
            out[run.id][kind] = metric_series(run.id, kind, bucket=bucket)
    return out

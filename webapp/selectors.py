"""Reads for views and consumers. Every read of a run goes through ``Run.objects.visible_to(user)``."""

from __future__ import annotations

import json
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import Case, Count, F, FloatField, OuterRef, Q, QuerySet, Subquery, Sum, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, NullIf
from django.http import Http404
from django.shortcuts import get_object_or_404

from experience import selectors as bank
from experience.embedding import embedder_warming_up
from experience.models import Experience, SearchAsk
from trainer import paths
from trainer.config import ConfigError, RunConfig
from trainer.experiments.spec import ExperimentSpec
from webapp import charts
from webapp.celery import app
from webapp.committed import CommittedRun
from webapp.models import EpisodeRecord, Experiment, MetricRow, Run, RunQuerySet

RUN_SORTS = {
    "created": "-created_at",
    "oldest": "created_at",
    "name": "name",
    "step": "-step",
    "status": "status",
    "success": F("latest_success").desc(nulls_last=True),
}
LATEST_SUCCESS_KEY = "train/success"
"""The train metric shown as "latest success" in the runs list."""
WORKER_CACHE_S = 10
"""The worker indicator pings Celery at most this often (a ping waits for its timeout when none answer)."""


def run_list(user, *, filters: dict[str, Any] | None = None, sort: str = "created") -> RunQuerySet:
    """Runs the user may see, with their latest train success, filtered and sorted."""
    filters = filters or {}
    latest = (
        MetricRow.objects.filter(run=OuterRef("pk"), kind=MetricRow.Kind.TRAIN)
        .order_by("-step")
        .annotate(success=Cast(KeyTextTransform(LATEST_SUCCESS_KEY, "values"), FloatField()))
        .values("success")[:1]
    )
    qs = Run.objects.visible_to(user).select_related("owner").annotate(latest_success=Subquery(latest))
    if filters.get("status"):
        qs = qs.with_display_status(filters["status"])
    if filters.get("method"):
        qs = qs.filter(method=filters["method"])
    if filters.get("env"):  # a part of the name: "Room-5x5" finds MiniHack-Room-5x5
        qs = qs.filter(env__icontains=filters["env"])
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


def experiment_list(user):
    """Experiments this user may see (their own, shared ones, or all for staff), with their finished cells
    (``done``; the grid's size is ``Experiment.cell_count``)."""
    qs = (
        Experiment.objects.all()
        if user.is_staff
        else Experiment.objects.filter(Q(owner=user) | Q(shared=True))
    )
    done = Count("runs", filter=Q(runs__status=Run.Status.SUCCEEDED))
    return qs.select_related("owner").annotate(done=done)


def experiment_get(user, name: str, *, owner: str | None = None):
    """The experiment called ``name`` this user may see, else 404. Names are unique per owner: ``owner`` (a
    username) picks one; without it, the user's own comes first, then a shared one, then (for staff) any,
    oldest first."""
    qs = experiment_list(user).filter(name=name)
    if owner:
        qs = qs.filter(owner__username=owner)
    mine_first = Case(When(owner=user, then=0), When(shared=True, then=1), default=2)
    found = qs.annotate(rank=mine_first).order_by("rank", "created_at", "id").first()
    if found is None:
        raise Http404("no such experiment")
    return found


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
        try:
            replies = app.control.inspect(timeout=0.5).ping() or {}
        except Exception:  # broker down: no worker can take a run either
            replies = {}
        workers = sorted(replies)
        cache.set("studio:workers", workers, WORKER_CACHE_S)
    return {"workers": workers, "queued": Run.objects.filter(status=Run.Status.QUEUED).count()}


# ---- launch templates: the config files in configs/ and configs/experiments/ ---------------------------

TEMPLATE_SUFFIXES = (".toml", ".json")


@dataclass(frozen=True)
class ConfigTemplate:
    """A config file the launch form can start from; its leading comment is its help text."""

    name: str
    """Its path under ``configs/``: ``cpu-room-random-grpo.toml``, ``experiments/room-random.toml``."""
    path: Path
    help: str
    experiment: bool
    """An experiment file (methods × seeds), not a run's config."""
    variants: tuple[str, ...] = ()
    """An experiment's variants (arms beyond its methods): the form cannot launch them."""


def configs_dir() -> Path:
    return paths.REPO_ROOT / "configs"


def leading_comment(text: str) -> str:
    """The ``#`` lines a file starts with, without the ``#`` (indentation inside the comment kept)."""
    lines: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].removeprefix(" ").rstrip())
    return "\n".join(lines).strip("\n")


def _read_table(path: Path) -> dict[str, Any]:
    """A TOML or JSON file's top-level table ({} if it is not one)."""
    try:
        data = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (ValueError, tomllib.TOMLDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def config_templates() -> list[ConfigTemplate]:
    """Every run config in ``configs/`` and every experiment in ``configs/experiments/``, by name."""
    root = configs_dir()
    found = []
    for folder, experiment in ((root, False), (root / "experiments", True)):
        for path in sorted(folder.glob("*")):
            if path.suffix not in TEMPLATE_SUFFIXES or not path.is_file():
                continue
            variants = _read_table(path).get("variants", []) if experiment else []
            names = tuple(str(v.get("name", "")) for v in variants if isinstance(v, dict))
            help_text = leading_comment(path.read_text())
            found.append(ConfigTemplate(str(path.relative_to(root)), path, help_text, experiment, names))
    return found


@dataclass(frozen=True)
class TemplateStart:
    """What a template starts the launch form from: a run config and the preset it names, or an experiment's
    first cell (``config``) with its grid (``spec``) and a name its owner has not used yet."""

    config: RunConfig
    preset: str | None = None
    spec: ExperimentSpec | None = None
    experiment_name: str = ""


def template_start(name: str, owner=None) -> TemplateStart:
    """The template ``name`` read for ``owner``; ConfigError if there is none or it is invalid."""
    template = next((t for t in config_templates() if t.name == name), None)
    if template is None:
        raise ConfigError(f"no template {name!r} in configs/")
    if not template.experiment:
        preset = _read_table(template.path).get("preset")
        return TemplateStart(RunConfig.from_file(template.path), preset=preset)
    spec = ExperimentSpec.from_file(template.path)
    method = spec.methods[0] if spec.methods else spec.variants[0].method
    config = spec.base.with_overrides(**spec.budget, method=method, seed=min(spec.seeds))
    return TemplateStart(config, spec=spec, experiment_name=free_experiment_name(spec.name, owner))


def free_experiment_name(name: str, owner) -> str:
    """``name``, or ``name-2``, ``name-3`` ... when ``owner`` has an experiment called that already (each
    owner names experiments in a namespace of their own)."""
    taken = set(Experiment.objects.filter(owner=owner, name__startswith=name).values_list("name", flat=True))
    return next(n for n in [name, *(f"{name}-{i}" for i in range(2, 1000))] if n not in taken)[:80]


# ---- metrics -------------------------------------------------------------------------------------


@dataclass
class Series:
    """One kind of metric rows of a run, maybe thinned: x columns and one column per key."""

    step: list[int] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    cursor: int = 0
    """Id of the newest row included: live updates continue after it."""
    bucket: int = 1

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "wall": self.wall, "values": self.values, "bucket": self.bucket}


def metric_series(
    run_id: int, kind: str, *, max_points: int = charts.MAX_POINTS, bucket: int | None = None
) -> Series:
    """A run's metric rows of one kind, thinned in the database so a browser gets at most ``max_points``
    points however long the run: the last row of every bucket of steps, and the newest row.

    Thinning, not averaging: an average must read every row's JSON (about 1.5 s for 100k rows of 20 metrics
    here), while picking rows reads only the chosen ones (about 50 ms); the page smooths the curves anyway.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(step) FROM webapp_metricrow WHERE run_id = %s AND kind = %s", [run_id, kind]
        )
        top = cursor.fetchone()[0]
        if top is None:
            return Series()
        bucket = bucket or charts.bucket_size(top, max_points)
        cursor.execute(
            'SELECT id, step, wall_time, "values" FROM webapp_metricrow WHERE run_id = %s AND kind = %s '
            "AND (step %% %s = %s OR step = %s) ORDER BY step",
            [run_id, kind, bucket, bucket - 1, top],
        )
        rows = cursor.fetchall()
    return _series([(row_id, step, wall, _as_dict(values)) for row_id, step, wall, values in rows], bucket)


def _series(rows: list[tuple[int, int, float, dict[str, Any]]], bucket: int) -> Series:
    """``(id, step, wall time, values)`` rows, in step order, as a Series (numbers only)."""
    dicts = [values for *_, values in rows]
    keys = sorted({k for values in dicts for k, v in values.items() if type(v) in _NUMBER})
    return Series(
        step=[step for _, step, _, _ in rows],
        wall=[round(wall, 3) for _, _, wall, _ in rows],
        values={k: [v if type(v := d.get(k)) in _NUMBER else None for d in dicts] for k in keys},
        cursor=max(row_id for row_id, *_ in rows),
        bucket=bucket,
    )


COMMITTED_KINDS = {MetricRow.Kind.TRAIN: "step", MetricRow.Kind.EVAL: "eval"}
"""A metric row's kind in the database, and in a committed ``metrics.jsonl``."""


def committed_series(run: CommittedRun, kind: str, bucket: int) -> Series:
    """A committed cell's rows of one kind, thinned like ``metric_series``; wall time from its first row."""
    rows = [r for r in run.rows if r.get("kind") == COMMITTED_KINDS[kind] and type(r.get("step")) is int]
    if not rows:
        return Series()
    start, top = min(r.get("time", 0) for r in run.rows), max(r["step"] for r in rows)
    kept = [r for r in rows if r["step"] % bucket == bucket - 1 or r["step"] == top]
    return _series([(i, r["step"], r.get("time", start) - start, r) for i, r in enumerate(kept)], bucket)


_NUMBER = (int, float)  # exact types: bool is not a metric; jsonb holds no NaN or infinity


def _as_dict(values: Any) -> dict[str, Any]:
    """A raw cursor gives jsonb as text (Django leaves decoding to the field)."""
    return json.loads(values) if isinstance(values, str) else values


def run_metrics(run: Run, *, max_points: int = charts.MAX_POINTS) -> dict[str, Any]:
    """Everything the run page's charts start from: both kinds of series, the panels, the live cursor."""
    train = metric_series(run.id, MetricRow.Kind.TRAIN, max_points=max_points)
    evals = metric_series(run.id, MetricRow.Kind.EVAL, max_points=max_points)
    return {
        "series": {"train": train.as_json(), "eval": evals.as_json()},
        "panels": charts.panels_for({"train": train.values, "eval": evals.values}),
        "catalogue": charts.catalogue(),
        "cursor": max(train.cursor, evals.cursor),
        **charts.chart_options(),
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


NONFINITE_GRAD_STEPS = {"actor": "actor/nonfinite_grad_steps", "extractor": "extractor/nonfinite_grad_steps"}
"""Per part, the train metric that is 1.0 on a step whose optimiser step was skipped because the gradient
norm was NaN or inf (the trainer leaves the weights and the optimiser state as they were), else 0.0."""


def skipped_optimizer_steps(run: Run) -> dict[str, int]:
    """How many optimiser steps of each part (actor, extractor) were skipped for a gradient norm that was not
    finite, for the parts that skipped any: a run whose updates keep blowing up learns nothing from them."""
    rows = MetricRow.objects.filter(run=run, kind=MetricRow.Kind.TRAIN)
    totals = rows.aggregate(
        **{
            part: Sum(Cast(KeyTextTransform(key, "values"), FloatField()))
            for part, key in NONFINITE_GRAD_STEPS.items()
        }
    )
    return {part: round(total) for part, total in totals.items() if total and round(total) > 0}


def skipped_step_warnings(run: Run) -> dict[str, str]:
    """The run page's warning for each part that skipped optimiser steps (``skipped_optimizer_steps``)."""
    return {
        part: f"{n} {part} optimiser step{'s were' if n != 1 else ' was'} skipped because the gradient norm "
        "was not finite (NaN or inf); lower the learning rate or check the run's data."
        for part, n in skipped_optimizer_steps(run).items()
    }


MEASURED_STEPS = 5
"""How many of a run's newest steps (and evaluations) its time-left estimate reads: recent enough to follow
a change of load on its worker, enough not to follow one slow step."""


def measured_time_left(run: Run) -> dict[str, float] | None:
    """A running run's own pace: the median seconds of its newest steps (``time/step_s``) and evaluations
    (``eval/time_s``), and the time its remaining steps and evaluations take at that pace; None before its
    first step ended. On a shared worker this follows what the machine gives the run now, which the launch
    plan's estimate cannot know."""
    if run.status != Run.Status.RUNNING:
        return None
    step_s = _newest_median(run, MetricRow.Kind.TRAIN, "time/step_s")
    if step_s is None:
        return None
    eval_s = _newest_median(run, MetricRow.Kind.EVAL, "eval/time_s") or 0.0
    steps, every = int(run.config.get("steps", 0)), int(run.config.get("eval_every", 0))
    left = range(run.step + 1, steps + 1)
    evals = sum(1 for step in left if step == steps or (every and step % every == 0))
    return {"step_s": step_s, "left_s": len(left) * step_s + evals * eval_s}


def _newest_median(run: Run, kind: str, key: str) -> float | None:
    rows = MetricRow.objects.filter(run=run, kind=kind).order_by("-step")[:MEASURED_STEPS]
    values = sorted(v for v in (row.values.get(key) for row in rows) if isinstance(v, int | float))
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def rank_table(run: Run) -> dict[str, Any]:
    """The newest step's per-process figures of a torchrun run (``rank/<r>/<name>`` metrics, written by
    ``TrainingLoop.rank_metrics``): ``{"step", "ranks": [{"rank", "episodes", "guided", "free",
    "tokens_per_s", "rss_gib"}], "experience"}`` in rank order. ``free`` is what a rank played without
    experience (docs/design.md §7)."""
    latest = latest_values(run.id, "train")
    ranks: dict[int, dict[str, Any]] = {}
    for key, value in latest["values"].items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "rank" and parts[1].isdigit():
            ranks.setdefault(int(parts[1]), {"rank": int(parts[1])})[parts[2]] = value
    for row in ranks.values():
        if "guided" in row:  # recorded since guided episodes play on every rank
            row["free"] = row.get("episodes", 0.0) - row["guided"]
    try:
        cfg = RunConfig.from_dict(run.config)
    except ConfigError:  # a config this version no longer reads: the table without the experience columns
        cfg = None
    return {
        "step": latest["step"],
        "ranks": [ranks[r] for r in sorted(ranks)],
        "experience": bool(cfg and cfg.uses_experience),
    }


LOG_FILE = "log.txt"
"""A run's progress lines (one per step and evaluation), in its folder; the run page shows the tail."""


def run_log_tail(run: Run, lines: int = 200) -> str:
    """The last ``lines`` lines of the run's progress log (``log.txt`` in its folder), or ""."""
    if not run.checkpoint_dir:
        return ""
    path = Path(run.checkpoint_dir) / LOG_FILE
    try:
        with path.open("rb") as f:
            end = start = f.seek(0, 2)
            data = b""
            while start > 0 and data.count(b"\n") <= lines:  # read backwards until enough lines
                start = max(0, start - (64 << 10))
                f.seek(start)
                data = f.read(end - start)
    except OSError:
        return ""
    kept = data.decode("utf-8", errors="replace").splitlines()[1 if start else 0 :]  # a partial first line
    return "\n".join(kept[-lines:])


# ---- traces and episodes -------------------------------------------------------------------------


def run_traces(run: Run, limit: int = 30) -> list[Any]:
    """The newest Search-and-Ask exchanges of the run (query, entry found, refined answer)."""
    return list(SearchAsk.objects.filter(run=run).select_related("experience").order_by("-id")[:limit])


def episode_steps(run: Run) -> dict[str, list[int]]:
    """Steps that have recorded episodes, newest first, by kind (``EpisodeRecord.Kind``: training steps, and
    the steps after which an evaluation ran)."""
    steps: dict[str, list[int]] = {kind: [] for kind in EpisodeRecord.Kind.values}
    rows = EpisodeRecord.objects.filter(run=run).values_list("kind", "step").distinct().order_by("-step")
    for kind, step in rows:
        steps[kind].append(step)
    return steps


@dataclass
class TaskGroup:
    task_instance: int
    env: str
    seed: int
    guided: list[EpisodeRecord]
    free: list[EpisodeRecord]


def step_episodes(run: Run, kind: str, step: int) -> list[TaskGroup]:
    """A step's episodes of ``kind`` grouped by task instance, split into the guided and free subgroups (an
    evaluation's: its two columns, each eval instance of each env a group)."""
    groups: dict[tuple[int, str], TaskGroup] = {}
    episodes = EpisodeRecord.objects.filter(run=run, kind=kind, step=step)
    for ep in episodes.order_by("task_instance", "env", "id"):
        key = (ep.task_instance, ep.env)
        group = groups.setdefault(key, TaskGroup(ep.task_instance, ep.env, ep.seed, [], []))
        (group.guided if ep.guided else group.free).append(ep)
    return list(groups.values())


# ---- comparison ----------------------------------------------------------------------------------


def compare_series(
    runs: list[Run | CommittedRun], *, max_points: int = charts.MAX_POINTS
) -> dict[int | str, dict[str, Series]]:
    """Each run's series of both kinds (a committed cell's from its files), bucketed with one bucket size so
    steps line up across runs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, max(step) FROM webapp_metricrow WHERE run_id = ANY(%s) GROUP BY kind",
            [[r.id for r in runs if isinstance(r, Run)]],
        )
        top = dict(cursor.fetchall())
    for run in runs:
        if isinstance(run, CommittedRun):
            for kind, name in COMMITTED_KINDS.items():
                steps = [r["step"] for r in run.rows if r.get("kind") == name and type(r.get("step")) is int]
                top[kind] = max([top.get(kind) or 0, *steps])
    out: dict[int | str, dict[str, Series]] = defaultdict(dict)
    for run in runs:
        for kind in (MetricRow.Kind.TRAIN, MetricRow.Kind.EVAL):
            bucket = charts.bucket_size(top.get(kind, 0) or 0, max_points)
            if isinstance(run, CommittedRun):
                out[run.id][kind] = committed_series(run, kind, bucket)
            else:
                out[run.id][kind] = metric_series(run.id, kind, bucket=bucket)
    return out


# ---- experience bank -----------------------------------------------------------------------------

BANK_SORTS = {"recent": ("-updated_at", "-id"), "usage": ("-retrieval_count", "-id"), "success": None}
BANK_PAGE_SIZE = 100
"""Most entries the bank page lists (browsing or search results)."""
SEMANTIC_MIN_SIMILARITY = 0.3
"""Search by meaning lists only entries at least this similar (cosine, all-MiniLM-L6-v2) to the query. On a
real bank (246 entries of MiniHack runs), queries about its content reach 0.65–0.77 with ~60 entries above
0.4, while unrelated ones (shoes, a cake recipe, a failing test, a locked door) stay at or below 0.25."""


@dataclass(frozen=True)
class BankSearch:
    """How a search was made, as the page states it: which entries it lists, and what it says when none."""

    mode: str
    """'semantic' or 'text': the search that ran (full text while the meaning model is still loading)."""
    cutoff: str
    nothing: str


def bank_search(q: str, asked: str, limit: int = BANK_PAGE_SIZE) -> BankSearch:
    """By meaning unless full text was asked for, or the model is still loading: a search never waits for it
    (the web server starts loading it as it starts)."""
    if asked != "text" and not embedder_warming_up():
        return BankSearch(
            "semantic",
            f"By meaning: entries with a similarity of at least {SEMANTIC_MIN_SIMILARITY:.2f} to the query, "
            f"closest first, at most {limit}.",
            f"Nothing is close in meaning to “{q}”: no entry has a similarity of at least "
            f"{SEMANTIC_MIN_SIMILARITY:.2f}. Try other words, or full text.",
        )
    cutoff = f"Full text: entries with all the words, best match first, at most {limit}."
    if asked != "text":
        cutoff = f"The model for search by meaning is still loading (it loads as the server starts). {cutoff}"
    return BankSearch("text", cutoff, f"No entry contains the words of “{q}”.")


def bank_entries(run: Run, *, q: str = "", mode: str = "semantic", scope: str = "", sort: str = "recent",
                 pinned: bool = False, limit: int = BANK_PAGE_SIZE) -> list[Any]:  # fmt: skip
    """A run's bank for the bank page: search results by relevance, or browsing in the chosen order."""
    if q:
        found = list(_search_one(run, q, mode, scope=scope or None, limit=limit))
        return [e for e in found if e.pinned] if pinned else found
    return list(bank_browse(run, scope=scope, sort=sort, pinned=pinned)[:limit])


def bank_browse(run: Run, *, scope: str = "", sort: str = "recent", pinned: bool = False) -> QuerySet:
    """A run's live bank in the chosen order, lazily: the bank page without a search, and the API's pages."""
    qs = bank.experience_list(run, scope=scope or None, pinned=True if pinned else None)
    if sort == "success":
        rate = Cast("guided_successes", FloatField()) / NullIf(
            F("guided_successes") + F("guided_failures"), 0
        )
        return qs.annotate(rate=rate).order_by(F("rate").desc(nulls_last=True), "-id")
    return qs.order_by(*BANK_SORTS.get(sort) or BANK_SORTS["recent"])


def bank_entry(run: Run, entry_id: int) -> Any:
    """One entry of this run's bank (deleted ones too, for undo), else 404."""
    return get_object_or_404(Experience.objects.defer("embedding"), pk=entry_id, run=run)


def banks_overview(user) -> list[Run]:
    """Visible runs that have a bank, with its live size, biggest first."""
    live = Q(experiences__deleted_at__isnull=True)
    qs = Run.objects.visible_to(user).annotate(bank_size=Count("experiences", filter=live))
    return list(qs.filter(bank_size__gt=0).select_related("owner").order_by("-bank_size", "-id")[:200])


def bank_search_across(
    runs: list[Run], q: str, *, mode: str = "semantic", limit: int = 30
) -> list[tuple[Run, Any]]:
    """The best matches for ``q`` over several runs' banks (each searched with the bank's own selector)."""
    hits = [
        (e.similarity if mode == "semantic" else e.rank, run, e)
        for run in runs
        for e in _search_one(run, q, mode, limit=limit)
    ]
    hits.sort(key=lambda h: -h[0])
    return [(run, e) for _, run, e in hits[:limit]]


def _search_one(run: Run, q: str, mode: str, *, scope: str | None = None, limit: int) -> Any:
    """One bank's matches: by meaning above SEMANTIC_MIN_SIMILARITY (``similarity``), or full text
    (``rank``)."""
    if mode == "semantic":
        return bank.experience_semantic_search(
            run, q, scope=scope, limit=limit, min_similarity=SEMANTIC_MIN_SIMILARITY
        )
    return bank.experience_text_search(run, q, scope=scope, limit=limit)

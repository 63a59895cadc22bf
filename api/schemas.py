"""What the API reads and answers: the OpenAPI schema is generated from these."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from django.urls import reverse
from ninja import Field, Path, Schema
from pydantic import ConfigDict

from webapp.forms import RunFilterForm
from webapp.models import Run
from webapp.selectors import BANK_SORTS

BIGINT_MAX = 2**63 - 1
"""PostgreSQL's largest bigint: ids, offsets and cursors beyond it would fail in the database, not here."""
INT_MAX = 2**31 - 1
"""PostgreSQL's largest integer (a step)."""

PathId = Annotated[int, Path(ge=1, le=BIGINT_MAX)]
"""A run's or an entry's id in a URL."""
BankSort = Literal[tuple(BANK_SORTS)]
"""recent (changed), usage (retrievals), success (when used)."""


def _form_choices(field: str):
    """A run filter form field's choices as a Literal, so the schema lists the values the form accepts; the
    empty value too, which the form (not required) reads as its default."""
    values = [value for value, _ in RunFilterForm.base_fields[field].choices]
    return Literal[tuple(dict.fromkeys(["", *values]))]


class RequestBody(Schema):
    """A request body: exactly a JSON object of the documented keys with values of their JSON types. An
    unknown key, another JSON value (a list, a string, null) or a value of another type is refused (422);
    nothing is coerced ("2" is not 2, 1 is not true)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Error(Schema):
    detail: str


class IndexOut(Schema):
    user: str
    can_write: bool = Field(description="False for a read-only token.")
    openapi: str = Field(description="The OpenAPI schema.")
    docs: str = Field(description="The schema as browsable documentation.")


class RunOut(Schema):
    id: int
    name: str
    uid: UUID
    owner: str
    shared: bool
    tags: list[str]
    status: str = Field(description="queued, running, succeeded, failed, cancelled, or lost (no heartbeat).")
    method: str
    env: str
    seed: int
    step: int
    actor_version: int
    extractor_version: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str
    experiment: str | None
    cell: str
    latest_success: float | None = Field(None, description="The newest train/success (in run lists).")
    url: str = Field(description="The run's page.")

    @staticmethod
    def resolve_owner(run: Run) -> str:
        return run.owner.get_username()

    @staticmethod
    def resolve_status(run: Run) -> str:
        return run.display_status

    @staticmethod
    def resolve_experiment(run: Run) -> str | None:
        return run.experiment.name if run.experiment_id else None

    @staticmethod
    def resolve_latest_success(run: Run) -> float | None:
        return getattr(run, "latest_success", None)

    @staticmethod
    def resolve_url(run: Run) -> str:
        return reverse("run_detail", args=[run.id])


class RunDetailOut(RunOut):
    config: dict[str, Any]
    environment: dict[str, Any]
    resume_from: str
    worker: str
    heartbeat_at: datetime | None
    cancel_requested: bool
    progress: dict[str, Any] = Field(
        description="Where the current step is inside a long phase: step, phase (evaluation, rollouts, actor "
        "update, weight sync, checkpoint), done of total units (episodes, micro-batches), for rollouts the "
        "turn its episodes reached of at most turns, elapsed_s and eta_s (null until a unit or a turn "
        "finished; an upper bound when it counts turns), all as of at (Unix seconds, when it was reported). "
        "Empty before the first phase and once the run has ended (its status says how)."
    )

    @staticmethod
    def resolve_progress(run: Run) -> dict[str, Any]:
        live = run.status in (Run.Status.QUEUED, Run.Status.RUNNING)
        return run.progress if live else {}  # an ended run is in no phase (not "checkpoint")


class RunFilters(Schema):
    """The run list's filters, judged by the runs page's own filter form."""

    q: str | None = Field(None, description="Part of the name or environment.")
    status: _form_choices("status") | None = None
    method: _form_choices("method") | None = None
    env: str | None = None
    tag: str | None = None
    mine: bool = False
    sort: _form_choices("sort") | None = Field(None, description="Default: created (newest first).")


class SeriesOut(Schema):
    step: list[int]
    wall: list[float]
    values: dict[str, list[float | None]]
    bucket: int = Field(description="Steps per bucket: the last row of each bucket, and the newest row.")
    cursor: int = Field(description="Id of the newest row included; raw rows continue after it.")


class MetricsOut(Schema):
    train: SeriesOut
    eval: SeriesOut


class MetricRowOut(Schema):
    id: int
    step: int
    kind: str
    wall_time: float
    values: dict[str, Any]


class EpisodeOut(Schema):
    id: int
    step: int
    kind: str
    task_instance: int
    env: str
    seed: int
    guided: bool
    experience_id: int | None
    injected_experience: str
    reward: float
    success: bool
    num_actions: int
    turns: list[Any]
    actor_version: int
    extractor_version: int


class ExperienceOut(Schema):
    id: int
    scope: str
    title: str
    content: str
    version: int
    source_episode: str
    created_step: int
    updated_step: int
    retrieval_count: int
    last_retrieved_at: datetime | None
    training_count: int
    guided_successes: int
    guided_failures: int
    success_rate: float | None
    pinned: bool
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None


class ImportOut(Schema):
    """One JSONL import into a run's bank: validated, embedded, then written in one transaction (all or
    nothing)."""

    id: int
    file_name: str
    size: int = Field(description="Bytes uploaded.")
    status: str = Field(description="queued, validating, embedding, writing, succeeded, failed or cancelled.")
    lines: int = Field(description="Non-empty lines (known once validated).")
    done: int = Field(description="Lines validated, then lines embedded: progress of the current phase.")
    entries: int = Field(description="Entries added to the bank (when succeeded).")
    error: str = Field(description="Why nothing was imported (when failed).")
    cancel_requested: bool
    giving_way_since: datetime | None = Field(
        description="While embedding: since when it has been sharing the CPU with other work that keeps the "
        "cores busy (a training run), so it embeds more slowly or waits; null at full speed."
    )
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class LaunchChanges(RequestBody):
    """A launch, in the launch form's terms: every value is judged by the form itself."""

    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Config values by dotted key ({'actor.lr': 1e-5, 'steps': 50}) or nested "
        "({'actor': {'lr': 1e-5}}); anything not given comes from the starting config.",
    )
    name: str | None = Field(None, description="Default: method and environment (a clone: '<name> (clone)').")
    tags: list[str] | None = None
    shared: bool | None = Field(None, description="Let every user see the runs (a clone: as the original).")
    n_seeds: int = Field(1, description="Runs to launch, on seeds seed, seed+1, ...")
    submission: str = Field(
        "", description="Idempotency key (up to 64 hex digits): the same key again launches nothing new."
    )
    experiment: str = Field("", description="A name here launches a grid: experiment_methods × seeds.")
    experiment_methods: list[str] = Field(default_factory=list)
    experiment_seeds: list[int] = Field(default_factory=list)


class LaunchIn(LaunchChanges):
    preset: str = Field("cpu", description="The named preset to start from.")
    base: dict[str, Any] | None = Field(
        None, description="A full config to start from instead of the preset."
    )


class PlanPartOut(Schema):
    name: str
    bytes: int = Field(description="Bytes per device.")
    host: bool = Field(description="Held in host memory (on an accelerator: beside the device, not on it).")


class PlanWorkerOut(Schema):
    node: str
    devices: str
    why_not: str | None = Field(description="Why the launch cannot run on this worker; null when it can.")


class PaceOut(Schema):
    low: float = Field(description="Lowest measured / planned step time of the worker's newest runs.")
    median: float
    high: float
    runs: int = Field(
        description="How many runs the ratios come from (each: the median of its newest 5 steps)."
    )


class PlanOut(Schema):
    """A launch's plan (``trainer.plan``) on the worker it goes to, or on the largest when none can run it."""

    fits: bool = Field(description="Whether a worker can run it; a launch that does not fit is refused.")
    refusal: str | None = Field(description="Why not, with the plan's numbers and a fix.")
    queue: str | None = Field(description="The Celery queue it goes to (null when refused).")
    worker: str = Field(description="The worker it was planned on.")
    devices: str = Field(description="The devices it gets there.")
    device_kind: str
    nproc: int
    parts: list[PlanPartOut]
    peak_bytes: int = Field(description="Peak bytes per device.")
    device_memory: int = Field(description="Bytes each device has.")
    step_s: float = Field(description="Estimated seconds per training step.")
    eval_s: float = Field(description="Estimated seconds per evaluation.")
    measured_pace: PaceOut | None = Field(
        None,
        description="How the worker's newest runs stepped against their plans (null before it has one): "
        "multiply step_s and eval_s by low and high for the range to expect there.",
    )
    free_now: int | None = Field(
        None, description="Bytes free on the worker's machine at its last heartbeat (CPU workers; null else)."
    )
    table: str = Field(description="The plan as text, as `manage.py plan` prints it.")
    notes: list[str] = Field(description="What the figures assume (on many processes: what rank 0 holds).")
    workers: list[PlanWorkerOut] = Field(
        description="Every worker checked (the web server's machine when none has registered)."
    )


class LaunchOut(Schema):
    runs: list[RunOut]
    experiment: str | None
    again: bool = Field(description="True if this submission key had launched these runs already.")
    plan: PlanOut | None = Field(None, description="The plan it was accepted on (null for a repeated key).")


class Refused(Schema):
    """Every 422: a request the API will not act on, and why."""

    detail: str = Field(description="The reasons in one line.")
    errors: dict[str, list[str]] = Field(
        description="Messages by what the caller wrote: a parameter or body key the request's shape refuses "
        "('body' for the body as a whole), or a config key or launch field, exactly as the launch form shows "
        "them."
    )

"""``/api/v1/``: runs, their metrics, episodes and experience banks; launch, clone, resume and cancel;
bank imports, started, watched and cancelled.

Every read goes through the pages' selectors (``Run.objects.visible_to``), every write through the pages'
form and services, so the API can see and do exactly what its caller can on the pages."""

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, RawPostDataException
from django.shortcuts import get_object_or_404
from django.urls import reverse
from ninja import File, NinjaAPI, Query, Status, UploadedFile
from ninja.errors import ValidationError

from api.auth import AUTH, CallerThrottle, caller, signed_in, writing_caller
from api.launch import form_errors, launch_form, preset_base
from api.openapi import document_common_responses
from api.pagination import paginated
from api.parser import StrictJSONParser
from api.refusal import refusal
from api.schemas import (
    BIGINT_MAX,
    INT_MAX,
    BankSort,
    EpisodeOut,
    Error,
    ExperienceOut,
    ImportOut,
    IndexOut,
    LaunchChanges,
    LaunchIn,
    LaunchOut,
    MetricRowOut,
    MetricsOut,
    PathId,
    PlanOut,
    Refused,
    RunDetailOut,
    RunFilters,
    RunOut,
)
from experience import services as bank_services
from experience.bank import BankError
from experience.models import ImportJob
from experience.selectors import import_jobs
from trainer.plan import PlanError
from webapp import charts
from webapp.forms import ImportForm, RunFilterForm
from webapp.models import EpisodeRecord, MetricRow
from webapp.selectors import bank_browse, bank_entry, metric_series, run_get, run_list
from webapp.services import (
    Launched,
    RunError,
    can_edit_bank,
    can_launch,
    launch_placement,
    run_cancel,
    run_clone_initial,
    run_get_managed,
    run_resume,
)
from webapp.views_runs import launch_submitted
from webapp.workers import plan_summary


class StudioAPI(NinjaAPI):
    """The API whose OpenAPI document lists, for every operation, the statuses any operation can answer
    (``api.openapi``)."""

    def get_openapi_schema(self, *args: Any, **kwargs: Any) -> Any:
        return document_common_responses(super().get_openapi_schema(*args, **kwargs))


api = StudioAPI(
    title="Complementary RL Studio API",
    version="1",
    description="Runs, metrics, episodes and experience banks. Authenticate with a personal access token "
    "(`Authorization: Bearer crs_...`, made on your account page) or a browser session (writes then need "
    "the `X-CSRFToken` header). A request the API cannot act on as written is refused with 422 and "
    "`{detail, errors}`: a body that is not a JSON object, a key the operation does not document, a value of "
    "another JSON type, a parameter out of range or not among its listed values.",
    urls_namespace="api-v1",
    auth=AUTH,
    throttle=[CallerThrottle()],
    parser=StrictJSONParser(),
    docs_decorator=signed_in,
)


@api.exception_handler(PermissionDenied)
def _forbidden(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc) or "Forbidden"}, status=403)


@api.exception_handler(ValidationError)
def _refused(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return api.create_response(request, refusal(exc.errors), status=422)


@api.exception_handler(RawPostDataException)
def _not_json(request: HttpRequest, exc: RawPostDataException) -> HttpResponse:
    # a form-encoded write: the CSRF check has read the body as a form, so it cannot be read as JSON
    detail = "send the request body as JSON (Content-Type: application/json)"
    return api.create_response(request, {"detail": detail}, status=415)


@api.exception_handler(RunError)
def _conflict(request: HttpRequest, exc: RunError) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc)}, status=409)


def _require_launch(user) -> None:
    if not can_launch(user):
        raise PermissionDenied("you may not launch runs")


@api.get("/", response=IndexOut, tags=["meta"])
def index(request: HttpRequest):
    """Who is calling, and where the schema and its documentation are."""
    who = caller(request)
    return {
        "user": who.user.get_username(),
        "can_write": who.can_write,
        "openapi": reverse("api-v1:openapi-json"),
        "docs": reverse("api-v1:openapi-view"),
    }


# ---- runs ------------------------------------------------------------------------------------------


@api.get("/runs", response=list[RunOut], tags=["runs"])
@paginated
def runs(request: HttpRequest, filters: Query[RunFilters]):
    """The runs the caller may see (their own, shared ones; all for staff), filtered as on the runs page."""
    form = RunFilterForm(filters.model_dump(exclude_none=True))
    if not form.is_valid():
        raise ValidationError(
            [{"loc": ("query", f), "msg": " ".join(m), "type": "form"} for f, m in form.errors.items()]
        )
    data = form.cleaned_data
    return run_list(caller(request).user, filters=data, sort=data["sort"] or "created").select_related(
        "experiment"
    )


@api.get("/runs/{run_id}", response={200: RunDetailOut, 404: Error}, tags=["runs"])
def run(request: HttpRequest, run_id: PathId):
    return run_get(caller(request).user, run_id)


@api.get("/runs/{run_id}/metrics", response={200: MetricsOut, 404: Error}, tags=["metrics"])
def metrics(
    request: HttpRequest, run_id: PathId, max_points: int = Query(charts.MAX_POINTS, ge=2, le=10_000)
):
    """Both kinds of series, thinned in the database like the run page's charts: at most ``max_points``
    points each (the last row of every bucket of steps, and the newest row)."""
    found = run_get(caller(request).user, run_id)
    out = {}
    for kind in MetricRow.Kind:
        series = metric_series(found.id, kind, max_points=max_points)
        out[kind.value] = series.as_json() | {"cursor": series.cursor}
    return out


@api.get("/runs/{run_id}/metrics/rows", response=list[MetricRowOut], tags=["metrics"])
@paginated
def metric_rows(
    request: HttpRequest,
    run_id: PathId,
    kind: MetricRow.Kind | None = None,
    after: int = Query(0, ge=0, le=BIGINT_MAX),
):
    """Every metric row, oldest first; ``after`` a row id (a series' ``cursor``) continues from it."""
    rows = MetricRow.objects.filter(run=run_get(caller(request).user, run_id), id__gt=after)
    return (rows.filter(kind=kind) if kind else rows).order_by("id")


@api.get("/runs/{run_id}/episodes", response=list[EpisodeOut], tags=["episodes"])
@paginated
def episodes(
    request: HttpRequest,
    run_id: PathId,
    step: int | None = Query(None, ge=0, le=INT_MAX),
    kind: EpisodeRecord.Kind | None = None,
):
    """Recorded rollouts with their turns, by step and task instance (``step`` picks one step; ``kind``
    train: training steps' episodes, eval: the evaluations', ``guided`` being the with-experience column)."""
    qs = EpisodeRecord.objects.filter(run=run_get(caller(request).user, run_id))
    qs = qs if step is None else qs.filter(step=step)
    # "train" after "eval" alphabetically: a step's training episodes, then its evaluation's
    return (qs.filter(kind=kind) if kind else qs).order_by("step", "-kind", "task_instance", "id")


@api.get("/runs/{run_id}/bank", response=list[ExperienceOut], tags=["bank"])
@paginated
def bank(
    request: HttpRequest,
    run_id: PathId,
    scope: str = Query("", max_length=100),
    sort: BankSort = "recent",
    pinned: bool = False,
):
    """The run's live experience bank; ``sort``: recent (changed), usage (retrievals), success (when used)."""
    return bank_browse(run_get(caller(request).user, run_id), scope=scope, sort=sort, pinned=pinned)


@api.get("/runs/{run_id}/bank/{entry_id}", response={200: ExperienceOut, 404: Error}, tags=["bank"])
def bank_entry_detail(request: HttpRequest, run_id: PathId, entry_id: PathId):
    """One entry (a deleted one too: ``deleted_at`` says when)."""
    return bank_entry(run_get(caller(request).user, run_id), entry_id)


@api.get("/runs/{run_id}/imports", response=list[ImportOut], tags=["bank"])
@paginated
def imports(request: HttpRequest, run_id: PathId):
    """The run's bank imports, newest first: each one's phase, progress and outcome."""
    return import_jobs(run_get(caller(request).user, run_id)).order_by("-created_at", "-id")


@api.get("/runs/{run_id}/imports/{import_id}", response={200: ImportOut, 404: Error}, tags=["bank"])
def import_detail(request: HttpRequest, run_id: PathId, import_id: PathId):
    """One import: poll it until ``status`` is succeeded, failed or cancelled."""
    return get_object_or_404(ImportJob, pk=import_id, run=run_get(caller(request).user, run_id))


# ---- writes ----------------------------------------------------------------------------------------


def _editable_bank(request: HttpRequest, run_id: int):
    """The run, if the caller may change its bank (as on the bank page); else 403 (404 if they cannot see
    it)."""
    user = writing_caller(request).user
    run = run_get(user, run_id)
    if not can_edit_bank(user, run):
        raise PermissionDenied("you may not edit this run's experience bank")
    return run, user


IMPORT_RESPONSES = {201: ImportOut, 202: ImportOut, 403: Error, 404: Error, 422: Refused}


@api.post("/runs/{run_id}/imports", response=IMPORT_RESPONSES, tags=["bank"])
def import_start(request: HttpRequest, run_id: PathId, file: File[UploadedFile] = None):
    """Add the entries of a JSONL export (multipart, field ``file``), all or nothing, as the bank page's
    Import does: 201 when a small file was imported within the request, 202 when a larger one was queued for
    a worker (poll ``GET .../imports/{id}``; ``POST .../cancel`` stops it), 422 when nothing was imported and
    why."""
    run, user = _editable_bank(request, run_id)  # who may import before what they sent: 404 tells nothing
    form = ImportForm(files={"file": file} if file is not None else {})
    if not form.is_valid():
        return Status(422, {"detail": "nothing was imported", "errors": dict(form.errors)})
    job = bank_services.import_upload(run, form.cleaned_data["file"], user=user)
    if job.status == ImportJob.Status.FAILED:
        detail = f"nothing was imported: the file is not a valid experience export ({job.error})"
        return Status(422, {"detail": detail, "errors": {"file": [job.error]}})
    return Status(202 if job.status == ImportJob.Status.QUEUED else 201, job)


@api.post(
    "/runs/{run_id}/imports/{import_id}/cancel",
    response={200: ImportOut, 403: Error, 404: Error, 409: Error},
    tags=["bank"],
)
def import_cancel(request: HttpRequest, run_id: PathId, import_id: PathId):
    """Stop an import before it writes anything: a queued one ends now, one being validated or embedded at
    its next progress report (``status`` turns cancelled; nothing of it is imported). 409 once it has ended
    or is writing its entries."""
    run, _ = _editable_bank(request, run_id)
    job = get_object_or_404(ImportJob, pk=import_id, run=run)
    try:
        bank_services.import_job_cancel(job)
    except BankError as err:
        return Status(409, {"detail": f"not cancelled: {err}"})
    job.refresh_from_db()
    return job


LAUNCH_RESPONSES = {200: LaunchOut, 201: LaunchOut, 403: Error, 404: Error, 422: Refused}


def _launch_answer(launched: Launched | None, form) -> Status:
    if launched is None:
        errors = form_errors(form)
        detail = "; ".join(errors.get("plan", [])) or "the launch was refused"
        return Status(422, {"detail": detail, "errors": errors})
    experiment = launched.experiment
    body = {
        "runs": launched.runs,
        "experiment": experiment.name if experiment else None,
        "again": launched.again,
        "plan": plan_summary(launched.placement) if launched.placement is not None else None,
    }
    return Status(200 if launched.again else 201, body)


@api.post("/runs", response=LAUNCH_RESPONSES, tags=["runs"])
def launch(request: HttpRequest, body: LaunchIn):
    """Launch runs (or an experiment's grid) with the launch form's rules: the same checks, messages and
    permission (``webapp.launch_run``). 201 when queued, 200 when this ``submission`` key had been used."""
    user = writing_caller(request).user
    _require_launch(user)
    base = body.base if body.base is not None else preset_base(body.preset)
    form = launch_form(body, base=base, defaults={"preset": body.preset})
    return _launch_answer(launch_submitted(user, form), form)


@api.post("/plan", response={200: PlanOut, 403: Error, 422: Refused}, tags=["runs"])
def plan(request: HttpRequest, body: LaunchIn):
    """The plan of a launch body, without launching: bytes per device for each part, the peak, time per step
    and evaluation, the worker it would go to, or why no worker can run it (``fits`` false, ``refusal``).
    A body the launch form refuses for another reason is 422, as ``POST /runs`` answers it."""
    _require_launch(caller(request).user)
    base = body.base if body.base is not None else preset_base(body.preset)
    form = launch_form(body, base=base, defaults={"preset": body.preset})
    if not form.is_valid():
        return Status(422, {"detail": "the launch was refused", "errors": form_errors(form)})
    try:
        return plan_summary(launch_placement(form.config, form.spec))
    except PlanError as err:
        detail = f"the launch cannot be planned (it would launch unchecked): {err}"
        return Status(422, {"detail": detail, "errors": {"plan": [str(err)]}})


@api.post("/runs/{run_id}/clone", response=LAUNCH_RESPONSES, tags=["runs"])
def clone(request: HttpRequest, run_id: PathId, body: LaunchChanges):
    """Launch a copy of a visible run's config, with ``config`` changes, as the page's "clone" does."""
    user = writing_caller(request).user
    _require_launch(user)
    initial = run_clone_initial(run_get(user, run_id))
    form = launch_form(body, base=initial.pop("base"), defaults=initial)
    return _launch_answer(launch_submitted(user, form), form)


@api.post("/runs/{run_id}/resume", response={201: RunOut, 403: Error, 404: Error, 409: Error}, tags=["runs"])
def resume(request: HttpRequest, run_id: PathId):
    """A new run continuing this one (the caller's, or any for staff) from its last checkpoint."""
    user = writing_caller(request).user
    found = run_get_managed(user, run_id)
    _require_launch(user)
    return Status(201, run_resume(found, user))


@api.post("/runs/{run_id}/cancel", response={200: RunOut, 403: Error, 404: Error, 409: Error}, tags=["runs"])
def cancel(request: HttpRequest, run_id: PathId):
    """Cancel a queued run now, or ask a running one to stop between steps (the caller's; any for staff)."""
    return run_cancel(run_get_managed(writing_caller(request).user, run_id))

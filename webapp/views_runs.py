"""Launching runs (new, N seeds, clone, resume), cancelling them, and the live run page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from trainer.config import PRESETS, ConfigError
from trainer.plan import PlanError
from webapp.charts import flatten
from webapp.forms import ID_MAX, LaunchForm, config_initial, int_param
from webapp.models import Run
from webapp.selectors import (
    latest_values,
    measured_time_left,
    rank_table,
    run_get,
    run_log_tail,
    run_metrics,
    run_traces,
    skipped_step_warnings,
)
from webapp.services import (
    Launched,
    RunError,
    can_launch,
    can_manage,
    launch_placement,
    run_cancel,
    run_clone_initial,
    run_get_managed,
    run_launch,
    run_launched_again,
    run_resume,
)
from webapp.workers import plan_display


def run_launch_view(request: HttpRequest) -> HttpResponse:
    """The launch form. GET ?preset=NAME starts from a preset, ?template=NAME from a file in configs/
    (htmx swaps the form when either is picked), ?clone=ID from a run's config."""
    if not can_launch(request.user):
        raise PermissionDenied("you may not launch runs")
    if request.method == "POST":
        return _launch(request, LaunchForm(request.POST))
    clone_of = None
    if clone_id := int_param(request.GET, "clone", min_value=1, max_value=ID_MAX):
        clone_of = run_get(request.user, clone_id)
        initial = run_clone_initial(clone_of)
        form = LaunchForm(initial=config_initial(initial.pop("base")) | initial)
    elif template := request.GET.get("template"):
        try:
            form = LaunchForm.for_template(template, request.user)
        except ConfigError as err:
            messages.error(request, f"The template could not be used: {err}")
            form = LaunchForm.for_preset("cpu")
    else:
        preset = request.GET.get("preset", "cpu")
        form = LaunchForm.for_preset(preset if preset in PRESETS else "cpu")
    template = "webapp/_launch_form.html" if request.htmx else "webapp/launch.html"
    return render(request, template, {"form": form, "clone_of": clone_of})


@require_POST
def run_launch_plan(request: HttpRequest) -> HttpResponse:
    """The launch form's plan, re-rendered by htmx as the person edits: the form's values judged as a launch
    would judge them (bytes per device per part, the peak, time per step and evaluation, which worker)."""
    if not can_launch(request.user):
        raise PermissionDenied("you may not launch runs")
    form = LaunchForm(request.POST)
    context = {"form": form, "plan": None, "plan_error": ""}
    if form.is_valid():
        try:
            context["plan"] = plan_display(launch_placement(form.config, form.spec))
        except PlanError as err:  # a model of a shape the plan does not know: it would launch unchecked
            context["plan_error"] = str(err)
    return render(request, "webapp/_launch_plan.html", context)


def launch_submitted(user, form: LaunchForm) -> Launched | None:
    """Queue what a launch form asks for (the page's and the API's alike): the form checks the values into a
    config, ``run_launch`` places and queues it. None when the form or the launch is refused: the form's
    errors then say why (the launch's on the field at fault, or the form's own). A copy of a submission that
    launched already leads to what it launched, even one the form would now refuse."""
    if not form.is_valid():
        return run_launched_again(form.submission_token())
    try:
        return run_launch(user=user, **form.launch_arguments())
    except ValidationError as err:
        form.add_error(None, err)
        return None


def _launch(request: HttpRequest, form: LaunchForm) -> HttpResponse:
    """Queue what a valid launch form asks for (``launch_submitted``) and say so."""
    launched = launch_submitted(request.user, form)
    if launched is None:
        return render(request, "webapp/launch.html", {"form": form}, status=400)
    experiment, n = launched.experiment, len(launched.runs)
    what = f"experiment {experiment.name}: {n} runs" if experiment else f"{n} run{'s' if n > 1 else ''}"
    if launched.again:
        messages.info(request, f"This form was submitted already: it launched {what}.")
    else:
        messages.success(request, f"Queued {what}.")
    if experiment is not None:
        return redirect("experiment_detail", name=experiment.name)
    return redirect("run_detail", run_id=launched.runs[0].id) if n == 1 else redirect("home")


@require_POST
def run_cancel_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """Cancel from the list (htmx swaps the row) or from the run page."""
    run = run_get_managed(request.user, run_id)
    try:
        run = run_cancel(run)
    except RunError as err:
        if request.htmx:
            return render(request, "webapp/_run_row.html", {"run": run, "error": str(err)}, status=409)
        messages.error(request, str(err))
        return redirect("run_detail", run_id=run.id)
    if request.htmx and request.htmx.target and request.htmx.target.startswith("run-row-"):
        return render(request, "webapp/_run_row.html", {"run": run})
    messages.success(request, "Cancellation requested." if run.status == Run.Status.RUNNING else "Cancelled.")
    return redirect("run_detail", run_id=run.id)


@require_POST
def run_resume_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """A new run continuing this one from its last checkpoint."""
    run = run_get_managed(request.user, run_id)
    if not can_launch(request.user):
        raise PermissionDenied("you may not launch runs")
    try:
        resumed = run_resume(run, request.user)
    except RunError as err:
        messages.error(request, str(err))
        return redirect("run_detail", run_id=run.id)
    messages.success(request, "Queued a run that resumes from the last checkpoint.")
    return redirect("run_detail", run_id=resumed.id)


PARTIALS = {
    "run-header": "webapp/_run_header.html",
    "trace-feed": "webapp/_trace_feed.html",
    "latest-eval": "webapp/_latest_eval.html",
    "environment": "webapp/_run_environment.html",
    "run-log": "webapp/_run_log.html",
    "run-processes": "webapp/_run_processes.html",
}
REGION_READS: dict[str, dict[str, Callable[[Run], Any]]] = {
    "webapp/_run_header.html": {"skipped_steps": skipped_step_warnings, "time_left": measured_time_left},
    "webapp/_trace_feed.html": {"traces": run_traces},
    "webapp/_latest_eval.html": {"latest_eval": lambda run: latest_values(run.id, "eval")},
    "webapp/_run_log.html": {"log": run_log_tail},
    "webapp/_run_processes.html": {"processes": rank_table},
}
"""What each live region reads beyond the run (the selectors behind it): the page reads them all, an htmx
request for one region only its own."""


def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    """The live run page: curves (downsampled on the server), traces, config, environment, errors.
    An htmx request for one of its live regions (``PARTIALS``) renders just that region."""
    run = run_get(request.user, run_id)
    context = {
        "run": run,
        "can_manage": can_manage(request.user, run),
        "can_launch": can_launch(request.user),
    }
    partial = PARTIALS.get(request.htmx.target) if request.htmx else None
    for region in [partial] if partial else REGION_READS:
        context |= {key: read(run) for key, read in REGION_READS.get(region, {}).items()}
    if partial:
        return render(request, partial, context)
    context |= {"metrics": run_metrics(run), "config_rows": sorted(flatten(run.config).items())}
    return render(request, "webapp/run_detail.html", context)

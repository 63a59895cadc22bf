"""Launching runs (new, N seeds, clone, resume), cancelling them, and the live run page."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from trainer.config import PRESETS, ConfigError
from webapp.charts import flatten
from webapp.forms import ID_MAX, LaunchForm, config_initial, int_param
from webapp.models import Run
from webapp.selectors import latest_values, rank_table, run_get, run_log_tail, run_metrics, run_traces
from webapp.services import (
    RunError,
    can_launch,
    can_manage,
    run_cancel,
    run_clone_initial,
    run_get_managed,
    run_launch_submission,
    run_resume,
)
from webapp.workers import plan_display


def run_launch(request: HttpRequest) -> HttpResponse:
    """The launch form. GET ?preset=NAME starts from a preset, ?template=NAME from a file in configs/
    (htmx swaps the form when either is picked), ?clone=ID from a run's config."""
    if not can_launch(request.user):
        raise PermissionDenied("you may not launch runs")
    if request.method == "POST":
        return _launch(request, LaunchForm(request.POST))
    if clone_id := int_param(request.GET, "clone", min_value=1, max_value=ID_MAX):
        initial = run_clone_initial(run_get(request.user, clone_id))
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
    return render(request, template, {"form": form})


@require_POST
def run_launch_plan(request: HttpRequest) -> HttpResponse:
    """The launch form's plan, re-rendered by htmx as the person edits: the form's values judged as a launch
    would judge them (bytes per device per part, the peak, time per step and evaluation, which worker)."""
    if not can_launch(request.user):
        raise PermissionDenied("you may not launch runs")
    form = LaunchForm(request.POST)
    form.is_valid()
    plan = plan_display(form.placement) if form.placement is not None else None
    return render(request, "webapp/_launch_plan.html", {"form": form, "plan": plan})


def _launch(request: HttpRequest, form: LaunchForm) -> HttpResponse:
    """Queue what a valid launch form asks for (``run_launch_submission``) and say so."""
    launched = run_launch_submission(request.user, form)
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
    if partial == "webapp/_trace_feed.html":
        context["traces"] = run_traces(run)
    if partial == "webapp/_latest_eval.html":
        context["latest_eval"] = latest_values(run.id, "eval")
    if partial == "webapp/_run_log.html":
        context["log"] = run_log_tail(run)
    if partial == "webapp/_run_processes.html":
        context["processes"] = rank_table(run.id)
    if partial:
        return render(request, partial, context)
    context |= {
        "metrics": run_metrics(run),
        "latest_eval": latest_values(run.id, "eval"),
        "traces": run_traces(run),
        "log": run_log_tail(run),
        "config_rows": sorted(flatten(run.config).items()),
        "processes": rank_table(run.id),
    }
    return render(request, "webapp/run_detail.html", context)

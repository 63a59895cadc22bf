"""The runs list (the home page) and its live regions: the run table and the worker indicator."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from webapp.committed import committed_experiments
from webapp.forms import BadParameter, RunFilterForm
from webapp.models import Run
from webapp.selectors import run_list, worker_status
from webapp.services import can_launch


def home(request: HttpRequest) -> HttpResponse:
    """The runs this user may see, filtered and sorted; an htmx request gets just the table."""
    form = RunFilterForm(request.GET or None)
    filters, sort = {}, "created"
    if form.is_bound:
        if form.is_valid():
            filters, sort = form.cleaned_data, form.cleaned_data["sort"] or "created"
        else:
            messages.error(request, "Some filters were not understood and were ignored.")
    context = {
        "runs": run_list(request.user, filters=filters, sort=sort)[:500],
        "form": form,
        "can_launch": can_launch(request.user),
    }
    if request.htmx:
        return render(request, "webapp/_run_table.html", context)
    # a user with no run of their own is told what to do first
    context["has_own_runs"] = Run.objects.filter(owner=request.user).exists()
    context["committed"] = [] if context["has_own_runs"] else committed_experiments()
    return render(request, "webapp/home.html", context)


def workers(request: HttpRequest) -> HttpResponse:
    """The worker/queue indicator (polled by the list page; pinging Celery waits, so it is never inline)."""
    return render(request, "webapp/_workers.html", {"status": worker_status()})


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """400 (``handler400``): a request parameter the site refuses, with its message (which parameter, what it
    takes); other bad requests get a plain sentence (their details are for the log, not the page)."""
    message = str(exception) if isinstance(exception, BadParameter) else "The request was not understood."
    return render(request, "400.html", {"message": message}, status=400)

"""The runs list (the home page) and its live regions: the run table and the worker indicator."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from webapp.forms import BadParameter, RunFilterForm
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
    template = "webapp/_run_table.html" if request.htmx else "webapp/home.html"
    return render(request, template, context)


def workers(request: HttpRequest) -> HttpResponse:
    """The worker/queue indicator (polled by the list page; pinging Celery waits, so it is never inline)."""
    return render(request, "webapp/_workers.html", {"status": worker_status()})


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """400 (``handler400``): a request parameter the site refuses, with its message (which parameter, what it
    takes); other bad requests get a plain sentence (their details are for the log, not the page)."""
    message = str(exception) if isinstance(exception, BadParameter) else "The request was not understood."
    return render(request, "400.html", {"message": message}, status=400)

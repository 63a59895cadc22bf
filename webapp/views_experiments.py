"""Experiments: the list, one experiment's grid of cells (each a run with its own page) and its report; the
grids committed under ``docs/experiments/`` that this database has no experiment for, read-only from their
files (``webapp.committed``)."""

from __future__ import annotations

import mimetypes

from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

from webapp.committed import CommittedExperiment, committed_experiment, committed_experiments
from webapp.experiments import committed_cells, experiment_grid, results_dir
from webapp.selectors import experiment_get, experiment_list

REPORT_FILES = {"report.md", "summary.csv"}


def experiments(request: HttpRequest) -> HttpResponse:
    """The database's experiments this user may see, then the committed grids none of them covers."""
    rows = list(experiment_list(request.user))
    for experiment in rows:  # cells finished on another machine count too
        experiment.done += len(committed_cells(experiment))
    committed = committed_experiments(exclude={e.folder for e in rows})
    return render(request, "webapp/experiments.html", {"experiments": rows, "committed": committed})


def experiment_or_committed(request: HttpRequest, name: str):
    """The database's experiment ``name`` this user may see or, without one (and no ``?owner=``), the grid
    committed in ``docs/experiments/<name>/``; else 404."""
    owner = request.GET.get("owner")
    try:
        return experiment_get(request.user, name, owner=owner)
    except Http404:
        committed = None if owner else committed_experiment(name)
        if committed is None:
            raise
        return committed


def experiment_detail(request: HttpRequest, name: str) -> HttpResponse:
    """The grid: arms × seeds, each cell's run, status and latest step; the report when one was built.
    ``?owner=USERNAME`` picks whose experiment of that name (names are unique per owner)."""
    experiment = experiment_or_committed(request, name)
    if isinstance(experiment, CommittedExperiment):
        return committed_detail(request, experiment)
    owner_query = "?" + urlencode({"owner": experiment.owner.get_username()})
    report = results_dir(experiment.folder) / "report" / "report.md"
    context = {
        "experiment": experiment,
        "grid": experiment_grid(experiment, request.user),
        "report": report_html(report.read_text(encoding="utf-8"), experiment.name, owner_query)
        if report.exists()
        else "",
        "owner_query": owner_query,
    }
    return render(request, "webapp/experiment_detail.html", context)


def committed_detail(request: HttpRequest, experiment: CommittedExperiment) -> HttpResponse:
    """A committed grid's page: its cells from their result files, its report and its experiment file."""
    report = experiment.report_path
    context = {
        "experiment": experiment,
        "cells": experiment.cells,
        "report": report_html(report.read_text(encoding="utf-8"), experiment.name)
        if report.is_file()
        else "",
    }
    return render(request, "webapp/experiments_committed.html", context)


def report_html(markdown: str, name: str, owner_query: str = "") -> SafeString:
    """report.md as HTML (less a title that repeats the page's): raw HTML in it is escaped (entry titles are
    model output), tables rendered, and its plots (bare ``*.png`` names) point at
    ``experiment_report_file``."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(markdown)
    if len(tokens) > 2 and tokens[0].tag == "h1" and tokens[1].content == f"Experiment {name}":
        tokens = tokens[3:]  # the report's own title is the page's heading already
    for token in tokens:
        for child in token.children or []:
            src = str(child.attrGet("src") or "")
            if child.type == "image" and src.endswith(".png") and "/" not in src:
                child.attrSet("src", reverse("experiment_report_file", args=[name, src]) + owner_query)
    return mark_safe(md.renderer.render(tokens, md.options, {}))  # noqa: S308 - markdown-it escaped it


def experiment_report_file(request: HttpRequest, name: str, filename: str) -> HttpResponse:
    """A file of the built report: report.md, summary.csv or one of its PNG plots."""
    experiment = experiment_or_committed(request, name)
    if filename not in REPORT_FILES and not (filename.endswith(".png") and "/" not in filename):
        raise Http404("no such report file")
    committed = isinstance(experiment, CommittedExperiment)
    folder = experiment.folder if committed else results_dir(experiment.folder)
    path = folder / "report" / filename
    if not path.is_file():
        raise Http404(f"the report has not been built: manage.py experiment report {experiment.name}")
    content_type = mimetypes.guess_type(filename)[0] or "text/plain"
    if filename.endswith(".md"):
        content_type = "text/plain; charset=utf-8"
    return FileResponse(path.open("rb"), content_type=content_type)

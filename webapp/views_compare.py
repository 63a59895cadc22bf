"""Compare runs: overlaid or grouped curves, a summary table, a config diff and a CSV of the plotted data."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from webapp.charts import build_comparison, default_group
from webapp.committed import committed_run
from webapp.csv_cells import CsvWriter
from webapp.forms import CompareForm
from webapp.selectors import compare_series, runs_get


def _comparison(request: HttpRequest):
    form = CompareForm(request.GET)
    if not form.is_valid():
        return form, None
    runs = runs_get(request.user, form.cleaned_data["runs"])
    refs = form.cleaned_data["committed"]
    committed = [c for c in map(committed_run, refs) if c is not None]
    if len(committed) < len(refs):
        missing = ", ".join(r for r in refs if committed_run(r) is None)
        form.add_error("committed", f"no committed cell {missing} in this checkout (docs/experiments/)")
        return form, None
    if not runs and not committed:
        form.add_error("runs", "none of these runs exists or is visible to you")
        return form, None
    runs = [*runs, *committed]
    group = form.cleaned_data["group"] if "group" in request.GET else default_group(runs)
    form.cleaned_data["group"] = group  # the page shows the grouping it applied
    group = "" if group == "none" else group
    picked = form.cleaned_data["metric"]
    return form, build_comparison(runs, compare_series(runs), group=group or "", picked=picked)


def compare(request: HttpRequest) -> HttpResponse:
    """GET ?runs=1&runs=2[&group=seeds|none|<config key>][&metric=train:train/success ...][&x=step|wall]
    [&smooth=0.6]: shareable as a URL. Smoothing is off unless asked for."""
    form, comparison = _comparison(request)
    if comparison is None:
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, error)
        return redirect("home")
    context = {
        "form": form,
        "comparison": comparison,
        "x": form.cleaned_data["x"] or "step",
        "smooth": form.cleaned_data["smooth"] or 0,
    }
    return render(request, "webapp/compare.html", context)


def compare_csv(request: HttpRequest) -> HttpResponse:
    """The plotted (downsampled) points of every run as CSV: of the metrics the page draws (the picked ones,
    else its default set), or of every metric with ``?all=1``."""
    form, comparison = _comparison(request)
    if comparison is None:
        return HttpResponse("; ".join(e for es in form.errors.values() for e in es), status=400)
    response = HttpResponse(content_type="text/csv")
    every_metric = request.GET.get("all") == "1"
    name = "compare-all-metrics.csv" if every_metric else "compare.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = CsvWriter(response)
    writer.writerow(["run_id", "run_name", "group", "kind", "metric", "step", "wall_time", "value"])
    writer.writerows(comparison.csv_rows(every_metric=every_metric))
    return response

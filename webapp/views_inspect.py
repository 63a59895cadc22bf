"""The trajectory inspector: one step's episodes by task instance, guided and free side by side; or one
evaluation's, its two columns (without and with experience) side by side."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from webapp.charts import histogram
from webapp.forms import ID_MAX, choice_param, int_param
from webapp.models import EpisodeRecord
from webapp.selectors import episode_steps, run_get, step_episodes


def run_inspect(request: HttpRequest, run_id: int) -> HttpResponse:
    """GET ?kind=train|eval (training steps, the default, or evaluations) &step=N (default: the newest of
    that kind with episodes); ?episode=ID highlights one episode."""
    run = run_get(request.user, run_id)
    kind = choice_param(request.GET, "kind", EpisodeRecord.Kind.values, default=EpisodeRecord.Kind.TRAIN)
    steps = episode_steps(run)
    step = int_param(request.GET, "step", default=steps[kind][0] if steps[kind] else None)
    groups = step_episodes(run, kind, step) if step is not None else []
    rewards = [ep.reward for g in groups for ep in g.guided + g.free]
    context = {
        "run": run,
        "kind": kind,
        "evaluation": kind == EpisodeRecord.Kind.EVAL,
        "steps": steps[kind],
        "counts": {k: len(s) for k, s in steps.items()},
        "step": step,
        "groups": groups,
        "histogram": histogram(rewards),
        "highlight": int_param(request.GET, "episode", min_value=1, max_value=ID_MAX),
        "unknown_step": step is not None and step not in steps[kind],
    }
    return render(request, "webapp/inspect.html", context)

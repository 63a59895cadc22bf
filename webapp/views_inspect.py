"""The trajectory inspector: one step's episodes by task instance, guided and free side by side."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from webapp.charts import histogram
from webapp.forms import ID_MAX, int_param
from webapp.selectors import episode_steps, run_get, step_episodes


def run_inspect(request: HttpRequest, run_id: int) -> HttpResponse:
    """GET ?step=N (default: the newest step with episodes); ?episode=ID highlights one episode."""
    run = run_get(request.user, run_id)
    steps = episode_steps(run)
    step = int_param(request.GET, "step", default=steps[0] if steps else None)
    groups = step_episodes(run, step) if step is not None else []
    rewards = [ep.reward for g in groups for ep in g.guided + g.free]
    context = {
        "run": run,
        "steps": steps,
        "step": step,
        "groups": groups,
        "histogram": histogram(rewards),
        "highlight": int_param(request.GET, "episode", min_value=1, max_value=ID_MAX),
        "unknown_step": step is not None and step not in steps,
    }
    return render(request, "webapp/inspect.html", context)

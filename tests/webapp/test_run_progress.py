"""A run's progress inside a long phase (the reporter stores it, the run page and the API show it), and the
per-process table of a run trained by several processes."""

from __future__ import annotations

import html
import json
import time

import pytest

from trainer.config import get_preset
from trainer.report import Progress
from webapp.models import MetricRow, Run
from webapp.progress import RunReporter

pytestmark = pytest.mark.django_db


def test_the_reporter_stores_the_phase_and_the_page_and_api_show_it(client, user):
    run = Run.objects.create(name="r", owner=user, status=Run.Status.RUNNING, config={"steps": 3})
    client.force_login(user)
    assert 'id="run-progress" data-progress="{}" hidden' in client.get(f"/runs/{run.id}/").content.decode()

    progress = Progress(RunReporter(run), every_s=0)
    progress.start(0, "evaluation", "episodes", 8)
    progress.started -= 130  # 2m 10s into it
    progress.advance(2)
    run.refresh_from_db()
    assert run.progress | {"elapsed_s": 0} == {
        "step": 0, "phase": "evaluation", "unit": "episodes", "done": 2, "total": 8, "elapsed_s": 0,
        "eta_s": run.progress["eta_s"], "at": run.progress["at"],
    }  # fmt: skip
    assert abs(run.progress["at"] - time.time()) < 5  # when it was reported: a page catches up from it
    assert 389 < run.progress["eta_s"] < 392  # 6 more at 65 s each

    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "evaluation · 2 of 8 episodes · 2m 10s · about 6m 30s left" in page
    detail = client.get(f"/api/v1/runs/{run.id}").json()
    assert detail["progress"]["phase"] == "evaluation" and detail["progress"]["done"] == 2

    progress.start(1, "weight sync")  # a phase without units: its name and time only
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert ">weight sync · 0s</p>" in page


def test_a_page_rendered_between_reports_shows_the_time_since_and_the_turn_of_a_batch(client, user):
    run = Run.objects.create(name="r", owner=user, status=Run.Status.RUNNING, config={"steps": 3})
    reported = {"step": 1, "phase": "rollouts", "unit": "episodes", "done": 0, "total": 16, "turn": 12,
                "turns": 50, "elapsed_s": 60.0, "eta_s": 190.0, "at": time.time() - 45}  # fmt: skip
    Run.objects.filter(pk=run.pk).update(progress=reported)
    client.force_login(user)
    page = client.get(f"/runs/{run.id}/").content.decode()
    # 45 s after the report: the clock went on and the estimate (an upper bound: it counts turns) went down
    assert "rollouts · 0 of 16 episodes · turn 12 of 50 · 1m 45s · at most 2m 25s left" in page
    shown = json.loads(html.unescape(page.split('id="run-progress" data-progress="')[1].split('"')[0]))
    assert 104 < shown["elapsed_s"] < 107 and shown["turn"] == 12  # what the page's script ticks on from


def test_a_running_run_estimates_its_time_left_from_its_own_steps(client, user):
    config = {"steps": 10, "eval_every": 5}
    run = Run.objects.create(name="r", owner=user, status=Run.Status.RUNNING, config=config, step=4)
    client.force_login(user)
    assert 'id="run-time-left"' not in client.get(f"/runs/{run.id}/").content.decode()  # no step yet
    for step, seconds in enumerate([300.0, 100.0, 120.0, 110.0], start=1):  # the first step was slow
        MetricRow.objects.create(run=run, step=step, wall_time=step, values={"time/step_s": seconds})
    MetricRow.objects.create(run=run, kind="eval", step=0, wall_time=0, values={"eval/time_s": 40.0})
    page = client.get(f"/runs/{run.id}/").content.decode()
    # median of the 4 steps 115 s; 6 steps and 2 evaluations (steps 5 and 10) left: 6 x 115 + 2 x 40 = 770 s
    assert "1m 55s a step, about 12m 50s left" in page.split('id="run-time-left"')[1].split("</span>")[0]


def test_a_finished_run_shows_no_progress_line(client, user):
    run = Run.objects.create(
        name="r", owner=user, status=Run.Status.SUCCEEDED, progress={"phase": "checkpoint"}
    )
    client.force_login(user)
    assert 'id="run-progress"' not in client.get(f"/runs/{run.id}/").content.decode()


def test_a_run_on_two_processes_shows_each_ranks_share_and_memory(client, user):
    run = Run.objects.create(
        name="r", owner=user, status=Run.Status.RUNNING, config={"method": "grpo", "steps": 3, "nproc": 2}
    )
    client.force_login(user)
    assert "No step has finished yet: each rank" in client.get(f"/runs/{run.id}/").content.decode()
    values = {"train/episodes": 16.0, "rank/0/episodes": 8.0, "rank/0/tokens_per_s": 210.4,
              "rank/0/rss_gib": 3.25, "rank/1/episodes": 8.0, "rank/1/tokens_per_s": 198.0,
              "rank/1/rss_gib": 2.5}  # fmt: skip
    MetricRow.objects.create(run=run, step=1, wall_time=30.0, values=values)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Processes (2) at step 1" in page
    assert "<td>0</td><td>8</td><td>210</td><td>3.25 GiB</td>" in page
    assert "<td>1</td><td>8</td><td>198</td><td>2.50 GiB</td>" in page
    one = Run.objects.create(
        name="one", owner=user, status=Run.Status.RUNNING, config={"steps": 3, "nproc": 1}
    )
    assert 'id="run-processes"' not in client.get(f"/runs/{one.id}/").content.decode()


@pytest.mark.parametrize("no_search_and_ask", [True, False])
def test_an_experience_run_on_two_processes_shows_each_ranks_guided_and_free_share(
    client, user, no_search_and_ask
):
    switches = {"method": "complementary", "nproc": 2, "no_search_and_ask": no_search_and_ask}
    cfg = get_preset("cpu").with_overrides(**switches)
    run = Run.objects.create(name="r", owner=user, status=Run.Status.RUNNING, config=cfg.to_dict())
    shares = {0: (3.0, 1.0, 50.0, 2.0), 1: (3.0, 2.0, 40.0, 1.5)}  # episodes, guided, tokens/s, GiB
    names = ("episodes", "guided", "tokens_per_s", "rss_gib")
    values = {f"rank/{r}/{name}": v for r, row in shares.items() for name, v in zip(names, row, strict=True)}
    MetricRow.objects.create(run=run, step=1, wall_time=30.0, values=values)
    client.force_login(user)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "<th>guided</th><th>free</th>" in page
    assert "<td>0</td><td>3</td><td>1</td><td>2</td><td>50</td>" in page
    assert "<td>1</td><td>3</td><td>2</td><td>1</td><td>40</td>" in page
    assert "Every rank plays its share of the experience-guided and of the free episodes" in page


def test_the_extractors_work_is_shown_beside_the_loops_phase_and_neither_overwrites_the_other(client, user):
    run = Run.objects.create(name="c", owner=user, status=Run.Status.RUNNING, method="complementary")
    reporter = RunReporter(run)
    loop, track = Progress(reporter, every_s=0), Progress(reporter, every_s=0, track="extractor")
    loop.start(3, "rollouts", "episodes", 16)
    track.start(2, "extractor: merging", "chunks")
    track.advance(4)  # a count without a known end
    loop.advance(5)
    run.refresh_from_db()
    assert run.progress["phase"] == "rollouts" and run.progress["done"] == 5
    assert (
        run.progress["extractor"]["phase"] == "extractor: merging" and run.progress["extractor"]["done"] == 4
    )
    client.force_login(user)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "rollouts · 5 of 16 episodes · " in page and "extractor: merging · 4 chunks · " in page


def test_an_import_shows_its_phase_count_time_and_estimate(user):
    from datetime import timedelta

    from django.utils import timezone

    from experience.models import ImportJob
    from webapp.templatetags.run_pages import import_progress_line

    job = ImportJob(
        status="embedding", lines=100, done=25, phase_started_at=timezone.now() - timedelta(seconds=60)
    )
    line = import_progress_line(job)
    assert line.startswith("embedding · 25 of 100 lines · 1m 00s · about 3m 0")  # 75 more at 2.4 s each
    job.status, job.lines, job.done = "validating", 0, 40  # the line count is not known yet
    assert import_progress_line(job).startswith("validating · 40 lines · ")

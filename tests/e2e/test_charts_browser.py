"""The charts in a real headless Chromium: the run page's default panels, folded sections and panel filter;
the compare page's metric picker, small multiples and seed bands; the launch form's template picker.
Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth.models import Permission
from django.db import connections

from tests.e2e.conftest import ARTIFACTS, wait_for_js
from trainer.config import get_preset
from trainer.report import Progress
from webapp.events import broadcast_run_event
from webapp.forms import SeedListField
from webapp.models import Experiment, MetricRow, Run
from webapp.progress import RunReporter
from webapp.selectors import metric_event

PASSWORD = "correct horse battery"
EXTRACTOR_KEYS = [
    "extractor/loss", "extractor/clip_frac", "extractor/approx_kl", "extractor/grad_norm",
    "extractor/buffer", "extractor/samples", "extractor/steps", "extractor/tokens",
]  # fmt: skip


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _login(page, server: str) -> None:
    page.goto(server + "/login/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("#run-list")


def _run(owner, name: str, method: str, seed: int, experiment=None, steps=3, level=0.0) -> Run:
    cfg = get_preset("cpu").with_overrides(method=method, seed=seed)
    run = Run.objects.create(
        name=name, owner=owner, method=method, env=cfg.env, seed=seed, config=cfg.to_dict(),
        status=Run.Status.SUCCEEDED, step=steps, experiment=experiment,
        cell=f"{method}/s{seed}" if experiment else "",
    )  # fmt: skip
    for step in range(1, steps + 1):
        values = {
            "train/success": level + step / 10, "train/guided/success": level + step / 8,
            "train/free/success": level + step / 12, "train/reward": level + step / 10,
            "bank/size": 9.0 + 18 * (step - 1), "time/step_s": 30.0 + step, "time/rollout_s": 20.0,
            "actor/loss": 1 / step, "rollout/tokens_per_s": 90.0,
            **{key: i + step / 10 for i, key in enumerate(EXTRACTOR_KEYS)},
        }  # fmt: skip
        MetricRow.objects.create(run=run, step=step, wall_time=30.0 * step, values=values)
    for step in (0, steps):
        values = {"eval/success": level + step / 20, "eval/with_exp/success": level + step / 10}
        MetricRow.objects.create(run=run, step=step, kind="eval", wall_time=30.0 * step + 5, values=values)
    return run


@pytest.fixture
def alice(user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


def test_charts_and_launch_templates_in_a_browser(server, browser_page, alice):
    """One server and browser for the three pages (each start costs tens of seconds here)."""
    _login(browser_page, server)
    _live_progress(browser_page, server, alice)
    _run_page(browser_page, server, _run(alice, "three steps", "complementary", 0))
    _compare_page(browser_page, server, alice)
    _launch_templates(browser_page, server)


def _as_a_worker(fn, *args) -> None:
    """Call ``fn`` as a training process would, outside Playwright's event loop; its thread's database
    connection goes back to the test process's bounded pool afterwards."""

    def call():
        try:
            fn(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(call).result()


def _live_progress(page, server: str, owner) -> None:
    """A running run's header follows its phase over the socket: the episode count of an evaluation
    advances on the page before the evaluation (and so the step) has finished."""
    run = Run.objects.create(name="evaluating", owner=owner, status=Run.Status.RUNNING, config={"steps": 3})
    page.goto(f"{server}/runs/{run.id}/")
    page.wait_for_selector("#live-state.live")
    assert page.locator("#run-progress").is_hidden()
    progress = Progress(RunReporter(run), every_s=0)
    _as_a_worker(progress.start, 0, "evaluation", "episodes", 8)
    _as_a_worker(progress.advance, 3)
    shown = "document.getElementById('run-progress').textContent"
    wait_for_js(page, f"{shown}.startsWith('evaluation · 3 of 8 episodes · ')")
    _as_a_worker(progress.advance, 5)
    wait_for_js(page, f"{shown}.startsWith('evaluation · 5 of 8 episodes · ')")
    assert "left" in page.inner_text("#run-progress") and page.locator("#run-progress").is_visible()
    # no episode ends for a while (they run to the turn limit together): the turn moves, the clock ticks
    _as_a_worker(progress.start, 1, "rollouts", "episodes", 16)
    _as_a_worker(progress.advance, 0, 16, 2, 15)
    wait_for_js(page, f"{shown}.startsWith('rollouts · 0 of 16 episodes · turn 2 of 15 · ')")
    before = page.inner_text("#run-progress")
    wait_for_js(page, f"{shown} !== {json.dumps(before)}")  # with nothing sent meanwhile
    after = page.inner_text("#run-progress")
    assert after.startswith("rollouts · 0 of 16 episodes · turn 2 of 15 · ") and "at most" in after
    elapsed = [int(text.split(" · ")[3].rstrip("s")) for text in (before, after)]
    assert elapsed[1] > elapsed[0], (before, after)
    _shot(page, "charts-00-run-progress")


def _run_page(page, server: str, run: Run) -> None:
    page.goto(f"{server}/runs/{run.id}/")
    page.wait_for_selector("#chart-time canvas")
    shown = page.eval_on_selector_all("#charts > .chart", "boxes => boxes.map(b => b.id)")
    assert shown == ["chart-success", "chart-eval-success", "chart-reward", "chart-bank-size", "chart-time"]
    sections = page.eval_on_selector_all(
        "#panel-sections details", "ds => ds.map(d => [d.dataset.section, d.open])"
    )
    assert [open_ for _, open_ in sections] == [False] * len(sections) and len(sections) >= 3
    assert page.locator("#panel-sections canvas").count() == 0  # folded panels are drawn when opened

    # a 3-point curve is its values, smoothing or not; the x axis is the run's steps, in whole numbers
    plot = "window.studioRun.plots['bank-size']"
    assert page.evaluate(f"{plot}.data[1]") == [9, 27, 45]
    page.locator("#smoothing").fill("0.9")
    assert page.inner_text("#smoothing-value") == "0.9"
    assert page.evaluate(f"{plot}.data[1]") == [9, 27, 45]
    scale = page.evaluate("(({min, max}) => [min, max])(window.studioRun.plots['eval-success'].scales.x)")
    assert scale == [0, 3]
    assert page.evaluate("window.studioRun.plots.success.axes[0]._splits.every(Number.isInteger)")
    box = page.locator("#chart-bank-size .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    assert (
        page.locator("#chart-bank-size .u-legend .u-series").nth(1).locator(".u-value").inner_text() == "45"
    )
    _shot(page, "charts-01-run-default-panels")

    # a step arrives live, with a metric no panel had: the panels regroup, the x range follows the run
    page.wait_for_selector("#live-state.live")
    values = {"bank/size": 63.0, "train/success": 0.5, "extractor/new_metric": 1.0}
    row = MetricRow.objects.create(run=run, step=4, wall_time=120.0, values=values)
    with ThreadPoolExecutor(1) as pool:  # as a worker would, outside Playwright's event loop
        pool.submit(broadcast_run_event, run.id, metric_event(row)).result()
    wait_for_js(page, f"{plot}.data[1].length === 4")
    assert page.evaluate(f"{plot}.data[1]") == [9, 27, 45, 63]  # 4 points: still unsmoothed at 0.9
    assert page.evaluate("window.studioRun.plots.success.scales.x.max") == 4

    # the filter finds a folded panel: its section opens, everything else hides
    page.fill("#panel-filter", "extractor")
    page.wait_for_selector("#chart-extractor canvas")
    assert page.locator("#chart-success").is_hidden() and page.locator("#chart-extractor").is_visible()
    visible_sections = page.eval_on_selector_all(
        "#panel-sections details", "ds => ds.filter(d => !d.hidden).map(d => d.dataset.section)"
    )
    assert visible_sections == ["Experience bank and extractor"]
    assert "1 of" in page.inner_text("#panel-count")
    drawn = "window.studioRun.plots.extractor.series.slice(1).filter(s => s.show).length"
    assert page.evaluate(drawn) == 6  # of 9: the legend draws the others on a click
    page.locator("#chart-extractor .u-legend .u-series").nth(7).click()
    assert page.evaluate(drawn) == 7
    _shot(page, "charts-02-run-panel-filter")
    page.fill("#panel-filter", "")
    assert page.locator("#chart-success").is_visible() and page.locator("#chart-extractor").is_hidden()


def _compare_page(page, server: str, alice) -> None:
    grid = Experiment.objects.create(name="grid", owner=alice)
    runs = [
        _run(alice, "grpo s0", "grpo", 0, grid, steps=12),
        _run(alice, "grpo s1", "grpo", 1, grid, steps=12, level=0.1),
        _run(alice, "comp s0", "complementary", 0, grid, steps=12, level=0.2),
        _run(alice, "grpo s2", "grpo", 2, grid, steps=12),  # the same figures as grpo s0
    ]
    page.goto(f"{server}/compare/?" + "&".join(f"runs={r.id}" for r in runs))
    page.wait_for_selector("#charts canvas")
    assert page.input_value("input[name=group]") == "seeds"  # seeds of one arm: mean and 95% band
    titles = page.eval_on_selector_all("#charts .chart .u-title", "ts => ts.map(t => t.textContent)")
    assert titles == [
        "train/success", "train/guided/success", "train/free/success", "eval/success",
        "eval/with_exp/success", "train/reward", "bank/size", "time/step_s",
    ]  # fmt: skip
    assert page.evaluate("window.studioCompare.plots['train-train_success'].bands.length") == 2
    tops = page.eval_on_selector_all(
        "#charts .chart", "cs => cs.map(c => Math.round(c.getBoundingClientRect().top))"
    )
    assert tops[0] == tops[1] == tops[2]  # a grid of small charts, not one per row
    assert page.evaluate("document.documentElement.scrollHeight") < 2500
    _shot(page, "charts-03-compare-default")

    page.click("#metric-picker summary")
    page.fill("#metric-filter", "loss")
    visible = page.eval_on_selector_all(
        "#metric-picker label.metric:not([hidden])", "ls => ls.map(l => l.innerText.trim())"
    )
    assert visible == ["actor/loss", "extractor/loss"]
    page.check("#metric-picker input[value='train:actor/loss']")
    page.wait_for_selector("#chart-train-actor_loss canvas")
    page.fill("#metric-filter", "")
    page.uncheck("#metric-picker input[value='train:train/free/success']")
    assert page.locator("#chart-train-train_free_success").count() == 0
    assert page.inner_text("#picked-count") == "8"
    picked = parse_qs(urlparse(page.url).query)["metric"]
    assert "train:actor/loss" in picked and "train:train/free/success" not in picked
    _shot(page, "charts-04-compare-picked")
    page.reload()  # the URL holds the choice
    page.wait_for_selector("#chart-train-actor_loss canvas")
    assert page.locator("#chart-train-train_free_success").count() == 0

    page.goto(f"{server}/compare/?group=none&" + "&".join(f"runs={r.id}" for r in runs))  # one line a run
    page.wait_for_selector("#chart-train-train_success canvas")
    legend = page.eval_on_selector_all(
        "#chart-train-train_success .u-legend .u-series th", "ls => ls.map(l => l.innerText.trim())"
    )
    assert "grpo s2 (identical to grpo s0)" in legend and "grpo s0" in legend
    dashes = page.evaluate(
        "window.studioCompare.plots['train-train_success'].series.slice(1).map(s => JSON.stringify(s.dash))"
    )
    assert len(dashes) == 4 and len(set(dashes)) == 4  # coinciding lines still show both runs
    _shot(page, "charts-05-compare-identical")

    page.goto(
        f"{server}/compare/?group=none&runs={runs[0].id}&committed=room-random/grpo-s0"
    )  # beside a result
    page.wait_for_selector("#chart-train-train_success canvas")
    legend = page.eval_on_selector_all(
        "#chart-train-train_success .u-legend .u-series th", "ls => ls.map(l => l.innerText.trim())"
    )
    assert "grpo s0" in legend and "room-random grpo-s0 (committed)" in legend
    assert page.locator(".legend .badge", has_text="committed").count() == 1


def parse_seeds(text: str) -> list[int]:
    return SeedListField().to_python(text)


def _launch_templates(page, server: str) -> None:
    page.goto(server + "/runs/launch/")
    options = page.eval_on_selector_all("#id_template option", "os => os.map(o => o.value)")
    assert "cpu-room-random-grpo.toml" in options and "experiments/room-random.toml" in options
    page.select_option("#id_template", "cpu-room-random-grpo.toml")
    page.wait_for_selector("#template-help")
    assert "GRPO on MiniHack-Room-Random-5x5" in page.inner_text("#template-help")
    assert page.input_value("#id_steps") == "30" and page.input_value("#id_env") == "MiniHack-Room-Random-5x5"
    assert page.input_value("#id_method") == "grpo" and page.input_value("#id_tasks_per_step") == "4"
    _shot(page, "charts-05-launch-template")
    page.select_option("#id_template", "experiments/room-5x5.toml")
    page.wait_for_selector("#template-help:has-text('Grid B')")
    assert (
        page.input_value("#id_experiment") == "room-5x5"
        and page.input_value("#id_env") == "MiniHack-Room-5x5"
    )
    assert page.is_checked("#experiment-fields input[value='complementary']")
    methods = page.locator("#experiment-fields input[name=experiment_methods]:checked").count()
    seeds = len(parse_seeds(page.input_value("#id_experiment_seeds")))
    assert methods * seeds > 1
    assert page.inner_text("#launch-form button[type=submit]") == f"Launch experiment: {methods * seeds} runs"
    _shot(page, "charts-06-launch-experiment-template")
    # a grid asks first, in numbers; dismissing it launches nothing
    questions = []

    def dismiss(dialog):
        questions.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    before = Run.objects.count()
    page.click("#launch-form button[type=submit]")
    page.wait_for_timeout(500)
    page.remove_listener("dialog", dismiss)
    steps = page.input_value("#id_steps")
    assert questions == [
        f'This launches the experiment "room-5x5": {methods} methods × {seeds} seeds = '
        f"{methods * seeds} runs of {steps} steps each, not one run. Launch them?"
    ]
    assert Run.objects.count() == before and page.url.endswith("/runs/launch/")
    # without the experiment name it is one run again
    page.fill("#id_experiment", "")
    assert page.inner_text("#launch-form button[type=submit]") == "Launch"

"""A new user's first hour in a real headless Chromium, on a fresh database: the committed experiments are
listed and their pages render with their plots, a missing page is the styled 404, and the run, bank, compare
and experiment pages look right at 1400×900 (screenshots in test-artifacts/first-hour-*.png)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth.models import Permission

from experience import bank
from experience.embedding import default_embedder
from experience.models import Experience
from tests.e2e.conftest import ARTIFACTS, wait_for_js
from trainer.config import get_preset
from webapp.models import Experiment, MetricRow, Run

PASSWORD = "correct horse battery"
VIEWPORT = {"width": 1400, "height": 900}


@pytest.fixture
def alice(user):
    for codename in ("launch_run", "edit_bank"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"first-hour-{name}.png"), full_page=True)


def _run(owner, name: str, method: str, seed: int, steps: int, level: float = 0.0, **fields) -> Run:
    cfg = get_preset("cpu").with_overrides(method=method, seed=seed)
    run = Run.objects.create(
        name=name, owner=owner, method=method, env=cfg.env, seed=seed, config=cfg.to_dict(), step=steps,
        **fields,
    )  # fmt: skip
    for step in range(1, steps + 1):
        values = {
            "train/success": level + step / 4, "train/reward": level + step / 4, "bank/size": 2.0 * step,
            "time/step_s": 30.0 + step, "actor/loss": 1 / step + level,
        }  # fmt: skip
        MetricRow.objects.create(run=run, step=step, wall_time=30.0 * step, values=values)
    MetricRow.objects.create(run=run, step=0, kind="eval", wall_time=1, values={"eval/success": 0.25 + level})
    return run


def _bank(run: Run) -> None:
    embedder = default_embedder()
    lessons = [
        ("Walk to the stairs", "Find '>' on the map, then step toward it one square at a time."),
        ("Avoid walls", "A move into a wall wastes a turn: check the map before moving."),
    ]
    for title, content in lessons:
        vector = embedder.embed_one(bank.entry_text(title, content))
        bank.add(run.pk, "MiniHack", title, content, vector, embedding_model=embedder.model_id, step=1)


def test_a_new_users_first_hour_on_a_fresh_database(server, browser_page, alice, tmp_path):
    page = browser_page
    page.set_viewport_size(VIEWPORT)
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(f"{m.location.get('url')}: {m.text}"))
    page.goto(server + "/login/")
    page.fill("#id_username", alice.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("#run-list")
    assert not Experiment.objects.exists()

    _committed_experiments(page, server)
    _missing_page(page, server)
    long_line = "step 2 · " + " ".join(f"metric/{i}=0.{i:03d}" for i in range(60))
    (tmp_path / "log.txt").write_text("step 1 · train/success=0.25\n" + long_line + "\n")
    cancelled = _run(
        alice, "room cancelled", "complementary", 0, steps=2, status=Run.Status.CANCELLED,
        checkpoint_dir=str(tmp_path),
    )  # fmt: skip
    _bank(cancelled)
    _run_page(page, server, cancelled)
    _bank_page(page, server, cancelled)
    _cancel(page, server, _run(alice, "room queued", "grpo", 2, steps=0))
    other = _run(alice, "room grpo", "grpo", 1, steps=2, level=0.2, status=Run.Status.SUCCEEDED)
    _compare_page(page, server, cancelled, other)
    # no missing favicon, no script error (the 404 visited on purpose aside)
    assert [e for e in errors if "/no-such-grid/" not in e] == []


def _committed_experiments(page, server: str) -> None:
    page.goto(server + "/experiments/")
    names = page.eval_on_selector_all("tr.committed-experiment td:first-child a", "as => as.map(a => a.text)")
    assert names == ["dark-pool", "room-5x5", "room-random"]  # dark-pool: committed cell by cell
    page.click("tr.committed-experiment a >> text=room-random")
    page.wait_for_selector("#committed-report img")
    assert page.locator("#committed-cells tbody tr").count() == 9
    assert page.locator("#committed-report img").count() >= 4
    # every figure loads (waits for the slowest: the page is painted before its last image arrives)
    images = "[...document.querySelectorAll('#committed-report img')]"
    wait_for_js(page, f"{images}.every(i => i.complete && i.naturalWidth)")
    _shot(page, "experiment")
    page.goto(server + "/experiments/room-5x5/")
    page.wait_for_selector("#committed-report img")
    assert page.locator("#committed-cells tbody tr").count() == 6


def _missing_page(page, server: str) -> None:
    response = page.goto(server + "/experiments/no-such-grid/")
    assert response.status == 404
    assert page.locator("#not-found").is_visible()
    background = page.eval_on_selector("#not-found", "e => getComputedStyle(e).backgroundColor")
    assert background == "rgb(255, 255, 255)"  # the product's stylesheet, not a bare page
    page.click("#not-found >> text=runs list")
    page.wait_for_selector("#run-list")


def _run_page(page, server: str, run: Run) -> None:
    page.goto(f"{server}/runs/{run.id}/")
    page.wait_for_selector("#chart-success canvas")
    outcome = page.inner_text("#run-outcome")
    assert "Cancelled at step 2" in outcome and "2 bank entries" in outcome and "Clone this run" in outcome
    assert page.inner_text("#run-bank-size") == "2 entries"
    _bank_now_point(page, run, 2)
    log = page.locator("#run-log pre")
    assert "metric/59=0.059" in log.inner_text()
    assert log.evaluate("p => p.scrollWidth <= p.clientWidth")  # long lines wrap, nothing is cut
    # two points: drawn as dots, with a y range around them, not an empty frame
    for panel in ("success", "eval-success"):
        plot = f"window.studioRun.plots['{panel}']"
        assert page.evaluate(f"{plot}.series[1].points.show({plot}, 1)") is True, panel
    y = page.evaluate("(({min, max}) => [min, max])(window.studioRun.plots.success.scales.y)")
    assert y[0] <= 0.25 and y[1] >= 0.5 and y[1] - y[0] < 2
    _shot(page, "run")


def _bank_now_point(page, run: Run, count: int) -> None:
    """The Bank size chart ends with the header's count (its curve says 4 at step 2, recorded before that
    step's additions); an entry added later moves both when the header is re-rendered."""
    plot = "window.studioRun.plots['bank-size']"
    last = f"({plot}.data.at(-1).filter(v => v !== null))"
    assert page.evaluate(f"{plot}.series.at(-1).label") == "bank now (as in the header)"
    assert page.evaluate(last) == [count] and page.evaluate(f"{plot}.data[1].at(-1)") == 4
    embedder = default_embedder()
    title, content = "Read the goal", "The goal names the square to reach: find it on the map first."
    vector = embedder.embed_one(bank.entry_text(title, content))
    bank.add(run.pk, "MiniHack", title, content, vector, embedding_model=embedder.model_id, step=2)
    page.evaluate("document.body.dispatchEvent(new Event('run-step'))")  # as a new metric row does
    wait_for_js(page, "document.querySelector('#run-bank-size').textContent === '3 entries'")
    wait_for_js(page, f"{last}.length === 1 && {last}[0] === {count + 1}")
    bank.delete(Experience.objects.in_bank(run.pk).get(title=title).pk, run_id=run.pk, step=2)


def _cancel(page, server: str, run: Run) -> None:
    """Cancel a queued run from its page: the confirmation folds away by itself (errors would stay) and the
    page says what the run kept and how to start again."""
    page.goto(f"{server}/runs/{run.id}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Cancel run")
    page.wait_for_selector("#run-outcome")
    message = page.locator("#messages .message").first
    assert message.inner_text() == "Cancelled."
    assert message.evaluate("m => getComputedStyle(m).animationName") == "message-done"
    outcome = page.inner_text("#run-outcome")
    assert "Cancelled at step 0" in outcome and "no checkpoint" in outcome and "Resume" not in outcome


def _bank_page(page, server: str, run: Run) -> None:
    page.goto(f"{server}/runs/{run.id}/bank/")
    page.wait_for_selector("#bank-list table")
    assert page.inner_text("#bank-size") == "2 entries now"
    assert page.locator("#bank-list tbody tr").count() == 2
    _shot(page, "bank")


def _compare_page(page, server: str, a: Run, b: Run) -> None:
    page.goto(f"{server}/compare/?runs={a.id}&runs={b.id}")
    page.wait_for_selector("#charts .chart canvas")
    page.click("#metric-picker summary")
    page.check("input[name=metric][value='train:actor/loss']")
    query = parse_qs(urlparse(page.get_attribute("#csv-link", "href")).query)
    assert "train:actor/loss" in query["metric"]  # the CSV follows the picker
    assert "all=1" in page.get_attribute("#csv-all-link", "href")
    page.click("#metric-picker summary")
    _shot(page, "compare")

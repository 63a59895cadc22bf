"""The main user journeys in a real headless Chromium against daphne (HTTP + WebSockets) and PostgreSQL.

Screenshots of every page go to test-artifacts/. The live curve is fed the way a training worker feeds it:
a metric row is written, then an event is broadcast to the run's group through Redis.
"""

from __future__ import annotations

import csv
import io
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth.models import Permission

from experience import bank
from experience.embedding import default_embedder
from experience.models import Experience, ImportJob, SearchAsk
from tests.conftest import worker_on
from tests.e2e.conftest import ARTIFACTS, wait_for_js
from trainer.config import get_preset
from webapp.events import broadcast_run_event
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.selectors import metric_event

PASSWORD = "correct horse battery"
# the run launched from the form: one short step, so that a real worker trains it within the test
TINY_RUN = "rollout.max_new_tokens=8\nrollout.kv_cache_gib=0.25\neval_episodes=1\ncheckpoint_every=0"


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _metrics(run: Run, steps: range, base: float) -> None:
    for s in steps:
        MetricRow.objects.create(
            run=run,
            step=s,
            wall_time=3.0 * s,
            values={
                "train/success": base + s / 20,
                "train/guided/success": base + s / 15,
                "train/free/success": base + s / 30,
                "train/reward": base + s / 20,
                "actor/loss": 1 / (s + 1),
                "experience/bank_size": 3 * s,
                "time/rollout_s": 2.0,
            },
        )
    MetricRow.objects.create(
        run=run,
        step=steps[-1],
        kind="eval",
        wall_time=3.0 * steps[-1],
        values={"eval/with_exp/success": base + 0.3, "eval/success": base + 0.1},
    )


@pytest.fixture
def world(user, embedder):
    for codename in ("launch_run", "edit_bank"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    cfg = get_preset("cpu")
    baseline = Run.objects.create(
        name="grpo baseline",
        owner=user,
        method="grpo",
        env=cfg.env,
        config=cfg.with_overrides(method="grpo").to_dict(),
        status="succeeded",
        step=9,
    )
    live = Run.objects.create(
        name="complementary live",
        owner=user,
        method="complementary",
        env=cfg.env,
        config=cfg.to_dict(),
        status="running",
        step=4,
        seed=1,
    )
    from django.utils import timezone

    Run.objects.filter(pk=live.pk).update(heartbeat_at=timezone.now(), started_at=timezone.now())
    _metrics(baseline, range(10), 0.0)
    _metrics(live, range(5), 0.1)
    entries = [
        bank.add(
            live.pk,
            "MiniHack-Room-5x5",
            title,
            content,
            embedder.embed_one(title + "\n" + content),
            embedding_model=embedder.model_id,
            step=2,
        )
        for title, content in [
            ("Walk to the stairs", "Find the > on the map and move towards it one step at a time."),
            ("Never used advice", "Something nobody retrieves."),
        ]
    ]
    Experience.objects.filter(pk=entries[0].pk).update(
        retrieval_count=4, guided_successes=3, guided_failures=1
    )
    episode = EpisodeRecord.objects.create(
        run=live,
        step=4,
        task_instance=0,
        env=cfg.env,
        seed=3,
        guided=True,
        reward=1.0,
        success=True,
        num_actions=2,
        injected_experience="Walk to the stairs",
        experience_id=entries[0].pk,
        turns=[
            {"observation": "You see a room.", "action": "search[stairs]"},
            {"observation": "Refined: go east", "action": "east", "reward": 1.0},
        ],
    )
    EpisodeRecord.objects.create(
        run=live,
        step=4,
        task_instance=0,
        env=cfg.env,
        seed=3,
        guided=False,
        reward=0.0,
        success=False,
        num_actions=8,
        turns=[{"observation": "dark", "action": "north"}],
    )
    SearchAsk.objects.create(
        run=live,
        scope="MiniHack-Room-5x5",
        query="where are the stairs?",
        experience=entries[0],
        similarity=0.81,
        refined="Go east twice: the stairs are there.",
        episode_id=f"4/{cfg.env}/3/0/777",  # step/env/seed/group/sample seed, as trainer.coevolution names it
        step=4,
        success=True,
    )
    return {"baseline": baseline, "live": live, "entries": entries, "episode": episode}


@pytest.fixture(scope="session")
def embedder():
    return default_embedder()


def _queued_run_ids(queue: str) -> list[int]:
    """Run ids of the train_run messages waiting in ``queue`` (read without consuming them)."""
    import base64
    import json

    from webapp.celery import app

    with app.connection_for_write() as conn:
        raw = conn.default_channel.client.lrange(queue, 0, -1)
    bodies = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in raw]
    return [args[0] for args, _kwargs, _embed in bodies]


def test_a_user_logs_in_launches_watches_curates_and_compares(
    server, browser_page, world, user, training_queue
):
    page, live, baseline = browser_page, world["live"], world["baseline"]

    # log in
    page.goto(server + "/")
    assert "/login/" in page.url
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("#run-list")
    page.wait_for_selector("#workers .dot")
    assert "complementary live" in page.inner_text("#run-list")
    _shot(page, "01-runs")

    # launch: a bad value is refused next to its field, then a good launch queues a run
    page.click("text=Launch a run")
    page.fill("#id_k_rollouts", "7")
    page.fill("#id_steps", "2")
    page.click("#launch-form button[type=submit]")
    assert "must be even" in page.inner_text("#error-k_rollouts")
    assert Run.objects.count() == 2
    _shot(page, "02-launch-error")
    page.fill("#id_k_rollouts", "2")
    page.fill("#id_steps", "1")
    page.fill("#id_tasks_per_step", "1")
    page.fill("#id_turn_limit", "2")
    page.fill("#id_eval_every", "0")
    page.select_option("#id_method", "grpo")
    page.fill("#id_overrides", TINY_RUN)
    page.fill("#id_name", "e2e launch")
    page.click("#launch-form button[type=submit]")
    page.wait_for_selector("#run-header")
    launched = Run.objects.get(name="e2e launch")
    assert (
        launched.status == "queued" and launched.config["k_rollouts"] == 2 and launched.config["steps"] == 1
    )
    _shot(page, "03-launched")

    # a worker comes online and trains it: the open page draws the real step and the final status
    page.wait_for_selector("#live-state.live")
    with worker_on(training_queue):
        wait_for_js(page, "window.studioRun?.series?.train?.step?.at(-1) === 1", 600, interval_ms=500)
        page.wait_for_selector("#run-status.succeeded", timeout=300_000)
    assert page.inner_text("#run-step") == "1"
    page.wait_for_selector("#latest-eval:has-text('eval/success')")  # the final evaluation, swapped in live
    assert "–" not in page.inner_text("#environment tr:has-text('worker')")
    assert MetricRow.objects.filter(run=launched, kind="train", step=1).exists()
    _shot(page, "03-launched-trained")

    # the live run page: curves drawn from stored rows, then a new step arrives over the socket
    page.goto(f"{server}/runs/{live.id}/")
    page.wait_for_selector("#live-state.live")
    page.wait_for_selector("#chart-success canvas")
    assert page.evaluate("window.studioRun.series.train.step.length") == 5
    row = MetricRow.objects.create(
        run=live,
        step=5,
        wall_time=15.0,
        values={"train/success": 0.9, "train/guided/success": 0.95, "train/free/success": 0.8},
    )
    sent = time.monotonic()
    with ThreadPoolExecutor(1) as pool:  # as a worker would, outside Playwright's event loop
        pool.submit(broadcast_run_event, live.id, metric_event(row)).result()
    wait_for_js(page, "window.studioRun.series.train.step.at(-1) === 5", 30, interval_ms=10)
    latency = time.monotonic() - sent
    assert page.inner_text("#run-step") == "5"
    print(f"live update reached the page {latency * 1000:.0f} ms after the broadcast")
    assert latency < 1.0
    _shot(page, "04-run-live")

    # a Search-and-Ask trace, and the episode it belongs to
    page.click("#trace-feed summary")
    assert "Go east twice" in page.inner_text("#trace-feed")
    page.click("#trace-feed a:has-text('episode')")
    page.wait_for_selector("#task-0")  # the card of its task instance, guided and free side by side
    assert page.url.endswith("/episodes/?step=4#task-0")
    asked = page.locator(f"#task-0 #episode-{world['episode'].id}")
    asked.locator("[data-move='1']").click()
    assert asked.locator(".turn-no").inner_text() == "2"
    assert "Refined: go east" in asked.locator(".turn:not([hidden])").inner_text()
    _shot(page, "05-trajectories")

    # the experience bank: edit and pin an entry
    page.goto(f"{server}/runs/{live.id}/bank/")
    page.click("text=Walk to the stairs")
    page.fill("#id_title", "Walk to the stairs (checked)")
    page.click("#edit button[type=submit]")
    page.wait_for_selector("text=Saved.")
    page.click("#pin-button")
    page.wait_for_selector("#pinned-tag")
    entry = Experience.objects.get(pk=world["entries"][0].pk)
    assert entry.title == "Walk to the stairs (checked)" and entry.pinned
    assert list(entry.changes.values_list("kind", "actor").order_by("id")) == [
        ("add", "extractor"),
        ("update", "person"),
        ("pin", "person"),
    ]
    _shot(page, "06-bank-entry")

    # prune with a preview, then confirm
    page.goto(f"{server}/runs/{live.id}/bank/")
    page.check("#prune #id_never_retrieved")
    page.click("#prune button[type=submit]")
    page.wait_for_selector("#prune-preview")
    assert "1 entry would be deleted" in page.inner_text("#prune-preview")
    assert "Never used advice" in page.inner_text("#prune-preview")
    _shot(page, "07-prune-preview")
    # the button says at once that it works (this submit held back in the page, after the page's own handler)
    page.evaluate("window.addEventListener('submit', (e) => e.preventDefault(), {once: true})")
    page.click("#confirm-prune")
    assert page.inner_text("#confirm-prune") == "Deleting 1 entry…" and page.is_disabled("#confirm-prune")
    page.reload()
    before = page.inner_text("#prune-preview")
    page.click("#confirm-prune")
    page.wait_for_selector("text=Pruned 1 entry")
    assert "1 entry would be deleted" in before and page.inner_text("#bank-size") == "1 entry now"
    assert Experience.objects.get(pk=world["entries"][1].pk).is_deleted
    assert not Experience.objects.get(pk=world["entries"][0].pk).is_deleted
    _shot(page, "08-bank-after-prune")
    page.click("#undo-prune button[type=submit]")
    page.wait_for_selector("text=Undid the prune: 1 entry back.")
    assert page.inner_text("#bank-size") == "2 entries now"
    assert not Experience.objects.get(pk=world["entries"][1].pk).is_deleted

    # a background import's count reaches the page without a reload when it finishes
    job = ImportJob.objects.create(
        run=live, file_name="more.jsonl", status=ImportJob.Status.EMBEDDING, lines=4
    )
    page.goto(f"{server}/runs/{live.id}/bank/")
    page.wait_for_selector(f"#import-job-{job.id} .import-progress")
    vector = world["entries"][0].embedding
    bank.add(live.pk, "MiniHack-Room-5x5", "Imported lesson", "From a file.", vector, embedding_model="m")
    ImportJob.objects.filter(pk=job.pk).update(status=ImportJob.Status.SUCCEEDED, entries=1)
    counted = "document.getElementById('bank-size').textContent === '3 entries now'"
    wait_for_js(page, counted, timeout_s=15, interval_ms=250)  # the job's poll swaps it in, no reload
    assert "imported 1 entry" in page.inner_text(f"#import-job-{job.id}")

    # compare two runs from the list, then download the CSV
    page.goto(server + "/")
    page.check(f"#run-row-{baseline.id} input[type=checkbox]")
    page.check(f"#run-row-{live.id} input[type=checkbox]")
    page.click("#compare-button")
    page.wait_for_selector("#charts canvas")
    assert page.locator("#charts .chart").count() >= 5
    assert "grpo baseline" in page.inner_text("#eval-table") and "method" in page.inner_text("#config-diff")
    _shot(page, "09-compare")
    with page.expect_download() as info:
        page.click("#csv-link")
    rows = list(csv.DictReader(io.StringIO(open(info.value.path()).read())))
    assert {r["run_name"] for r in rows} == {"grpo baseline", "complementary live"}
    assert any(r["metric"] == "train/success" and r["step"] == "5" and r["value"] == "0.9" for r in rows)

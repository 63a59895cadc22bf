"""Issue 36, end to end: a 2-process complementary run launched from the browser form trains on a real
Celery worker (a torchrun group of two ranks); rank 1 is SIGKILLed after step 1's checkpoint and the
supervisor restarts the whole group, which resumes from it (πϕ's shards and the extractor track's state
included); the run writes each metric row once, distils every episode once, fills one bank without
duplicates, and its page shows both ranks and the restart. The actor is a tiny random-initialised Llama
(two ranks of SmolLM2, each with its engines, would crowd this box); πϕ is the prepared SmolLM2, on rank 0.
Screenshot: two-process-run.png."""

from __future__ import annotations

import shutil
import signal
import threading
import uuid

import pytest
from django.contrib.auth.models import Permission

from experience.models import Experience, ExperienceChange
from tests.conftest import wait_for, worker_on
from tests.e2e.conftest import ARTIFACTS
from tests.trainer.test_parallel_group import _ranks
from tests.trainer.tiny_models import tiny_llama_folder
from trainer import paths
from webapp.models import MetricRow, Run
from webapp.training import run_dir

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = "\n".join(
    [
        "eval_episodes=2",
        "checkpoint_every=1",
        "rollout.max_new_tokens=8",
        "rollout.kv_cache_gib=0.0625",
        "rollout.dtype=float32",
        "extractor.max_new_tokens=48",
        "extractor.buffer_size=2",
        "extractor.micro_batch_size=1",
        "experience.warmup_steps=0",
        "experience.merge_every=1",
    ]
)


@pytest.fixture
def tiny_actor():
    """The tiny Llama among the prepared models: a launch may only name models from those folders."""
    folder = paths.models_dir() / f"e2e-tiny-llama-{uuid.uuid4().hex[:8]}"
    yield tiny_llama_folder(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _kill_rank_1_after_step_1(run: Run, queue: str) -> int:
    """SIGKILL rank 1 of ``run``'s group once step 1 is checkpointed; its pid."""
    first = run_dir(run) / "checkpoints" / "step-000001" / "state.json"
    wait_for(first.exists, 900, "step 1's checkpoint")
    ranks = wait_for(lambda: _ranks(run, queue), 60, "both ranks")
    ranks[1].send_signal(signal.SIGKILL)
    return ranks[1].pid


@pytest.fixture
def alice(user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


def test_a_two_process_complementary_run_launched_from_the_browser(
    server, browser_page, alice, training_queue, tiny_actor
):

    page = browser_page
    page.goto(server + "/login/")
    page.fill("#id_username", alice.username)
    page.fill("#id_password", "correct horse battery")
    page.click("button[type=submit]")
    page.goto(server + "/runs/launch/")
    page.select_option("#id_method", "complementary")
    page.fill("#id_actor_model", str(tiny_actor))
    for field, value in {"steps": 2, "tasks_per_step": 1, "k_rollouts": 4, "turn_limit": 3, "eval_every": 0,
                         "nproc": 2}.items():  # fmt: skip
        page.fill(f"#id_{field}", str(value))
    page.fill("#id_overrides", SMALL)
    page.fill("#id_name", "two ranks")
    page.wait_for_selector("#plan-time:has-text('2 processes')")  # re-planned as the fields changed
    assert page.query_selector("#plan-verdict") is not None, page.inner_text("#plan-result")
    # Search-and-Ask on (the default): rank 0 searches every rank's questions; each rank plays guided episodes
    assert "Every rank plays its share of the guided and of the free" in page.inner_text("#plan-result")
    page.click("#launch-form button[type=submit]")
    page.wait_for_selector("#run-header")
    run = Run.objects.get(name="two ranks")
    assert run.status == "queued" and run.config["nproc"] == 2 and run.config["method"] == "complementary"

    page.wait_for_selector("#live-state.live")
    # the worker's solo pool answers the start-up ping only once the run is over: the kill is a thread's
    killed: list[int] = []
    killer = threading.Thread(target=lambda: killed.append(_kill_rank_1_after_step_1(run, training_queue)))
    killer.start()
    with worker_on(training_queue):
        page.wait_for_selector("#run-status.succeeded", timeout=900_000)
    killer.join(timeout=60)
    assert killed, "rank 1 was not killed"
    run.refresh_from_db()
    assert run.restarts == 1 and "resumed from the last checkpoint" in run.notice, run.notice
    assert run.environment["resumed_at_steps"] in ("1", "2")  # πϕ's shards came back from extractor/dcp/
    assert run.environment["device"] == "cpu" and run.environment["device_count"] == "2"
    assert "resumed from the last checkpoint" in page.inner_text("#run-notice")
    page.wait_for_selector("#rank-table")
    ranks = page.inner_text("#rank-table")
    # each rank played 2 of the step's 4 episodes: one guided and one free
    assert "\n0\t2\t1\t1\t" in ranks and "\n1\t2\t1\t1\t" in ranks, ranks
    assert "Search-and-Ask searches" in page.inner_text("#run-processes")
    page.screenshot(path=str(ARTIFACTS / "two-process-run.png"), full_page=True)

    # the evaluations rank 0 recorded, both columns, in the trajectory inspector
    page.goto(f"{server}/runs/{run.pk}/episodes/?kind=eval")
    kinds = page.inner_text("#episode-kinds")
    assert "Evaluations (2)" in kinds, kinds  # after steps 0 and 2
    assert len(page.query_selector_all("section.task")) == 2  # 2 eval instances, each with both columns
    page.screenshot(path=str(ARTIFACTS / "two-process-run-evaluations.png"), full_page=True)

    steps = sorted(MetricRow.objects.filter(run=run, kind="train").values_list("step", flat=True))
    assert steps == [1, 2]  # each row once
    last = MetricRow.objects.get(run=run, kind="train", step=2).values
    assert last["extractor/distilled"] == 8  # every episode of both steps distilled once, across the restart
    # each distilled operation applied once: no episode's entry added twice (the texts alone may repeat:
    # πϕ may write an entry it was shown again, or a merge may keep one beside its copy)
    added = [(c.after["source_episode"], c.after["title"], c.after["content"])
             for c in ExperienceChange.objects.filter(run=run, kind="add", actor="extractor")]  # fmt: skip
    assert len(added) == len(set(added)) > 0, added
    assert last["bank/size"] == Experience.objects.in_bank(run.pk, None).count()
    saved = run_dir(run) / "checkpoints" / "step-000002"
    assert (saved / "dcp" / ".metadata").exists()
    extractor_parts = ("dcp/.metadata", "state.pt", "model.safetensors")  # πϕ's shards, track, whole model
    assert all((saved / "extractor" / part).exists() for part in extractor_parts)

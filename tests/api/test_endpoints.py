"""What the API answers: run lists, metrics (thinned like the charts, or raw rows), episodes and banks
(paginated), and launch, clone, resume and cancel."""

from __future__ import annotations

import pytest

from experience.models import EMBEDDING_DIM, Experience
from tests.api.conftest import bearer, make_run
from webapp.models import EpisodeRecord, MetricRow, Run
from webapp.selectors import metric_series

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(client, launcher):
    """A client whose every request carries the launcher's read-write token."""
    client.defaults |= {"HTTP_AUTHORIZATION": bearer(launcher)["Authorization"]}
    return client


def _post(api, url: str, body: dict | None = None):
    return api.post(url, body or {}, content_type="application/json")


def test_the_run_list_shows_what_the_runs_page_shows_filtered_and_paginated(api, launcher, other_user):
    mine = [make_run(launcher, name=f"mine {i}", tags=["sweep"] if i % 2 else []) for i in range(5)]
    make_run(other_user, name="private")
    make_run(other_user, name="shared", shared=True)
    page = api.get("/api/v1/runs", {"limit": 2, "offset": 1}).json()
    assert page["count"] == 6 and [r["name"] for r in page["items"]] == ["mine 4", "mine 3"]
    tagged = api.get("/api/v1/runs", {"tag": "sweep", "sort": "oldest"}).json()
    assert [r["id"] for r in tagged["items"]] == [mine[1].id, mine[3].id]
    assert api.get("/api/v1/runs", {"mine": "true"}).json()["count"] == 5
    refused = api.get("/api/v1/runs", {"status": "exploded"})
    assert refused.status_code == 422 and "status" in refused.json()["detail"]
    run = api.get(f"/api/v1/runs/{mine[0].id}").json()
    assert run["owner"] == "alice" and run["status"] == "queued" and run["config"]["seed"] == 0
    assert run["url"] == f"/runs/{mine[0].id}/"


def test_metrics_are_thinned_like_the_charts_and_raw_rows_are_paginated(api, launcher):
    run = make_run(launcher)
    for step in range(25):
        MetricRow.objects.create(run=run, step=step, wall_time=step, values={"train/success": step / 25})
    MetricRow.objects.create(run=run, step=10, kind="eval", wall_time=20.0, values={"eval/success": 0.5})
    thinned = api.get(f"/api/v1/runs/{run.id}/metrics", {"max_points": 10}).json()
    expected = metric_series(run.id, "train", max_points=10)
    assert thinned["train"]["step"] == expected.step == [2, 5, 8, 11, 14, 17, 20, 23, 24]
    assert thinned["train"]["values"] == expected.values and thinned["train"]["bucket"] == 3
    assert thinned["eval"]["values"] == {"eval/success": [0.5]}
    rows = api.get(f"/api/v1/runs/{run.id}/metrics/rows", {"kind": "train", "limit": 10}).json()
    assert rows["count"] == 25 and [r["step"] for r in rows["items"]] == list(range(10))
    after = api.get(f"/api/v1/runs/{run.id}/metrics/rows", {"after": rows["items"][-1]["id"]}).json()
    assert after["count"] == 16 and after["items"][-1]["kind"] == "eval"


def test_episodes_and_bank_entries_are_paginated(api, launcher, other_user):
    run = make_run(launcher)
    for step, instance in [(0, 0), (0, 1), (1, 0)]:
        EpisodeRecord.objects.create(
            run=run, step=step, task_instance=instance, env="e", seed=1, guided=False, reward=1.0,
            success=True, num_actions=3, turns=[{"action": "north"}],
        )  # fmt: skip
    episodes = api.get(f"/api/v1/runs/{run.id}/episodes", {"step": 0}).json()
    assert episodes["count"] == 2 and episodes["items"][0]["turns"] == [{"action": "north"}]
    vector = [0.0] * (EMBEDDING_DIM - 1) + [1.0]
    entries = [Experience.objects.create(run=run, title=f"t{i}", content="c", embedding=vector,
                                         retrieval_count=i, pinned=i == 1) for i in range(4)]  # fmt: skip
    Experience.objects.filter(pk=entries[3].pk).update(deleted_at="2026-01-01T00:00Z")
    bank = api.get(f"/api/v1/runs/{run.id}/bank", {"sort": "usage", "limit": 2}).json()
    assert bank["count"] == 3 and [e["title"] for e in bank["items"]] == ["t2", "t1"]
    pinned = api.get(f"/api/v1/runs/{run.id}/bank", {"pinned": True}).json()["items"]
    assert [e["title"] for e in pinned] == ["t1"]
    assert api.get(f"/api/v1/runs/{run.id}/bank/{entries[3].id}").json()["deleted_at"] is not None
    elsewhere = make_run(other_user, shared=True)
    assert api.get(f"/api/v1/runs/{elsewhere.id}/bank/{entries[0].id}").status_code == 404


def test_launch_is_idempotent_per_submission_key_and_clone_keeps_the_config(api, launcher):
    body = {"config": {"steps": 3, "actor": {"lr": 2e-5}, "rollout.max_new_tokens": 40}, "n_seeds": 2,
            "tags": ["api"], "submission": "ab12"}  # fmt: skip
    first = _post(api, "/api/v1/runs", body)
    assert first.status_code == 201 and [r["seed"] for r in first.json()["runs"]] == [0, 1]
    again = _post(api, "/api/v1/runs", body)
    assert again.status_code == 200 and again.json()["again"] and Run.objects.count() == 2
    source = Run.objects.get(seed=1)
    assert source.config["actor"]["lr"] == 2e-5 and source.config["rollout"]["max_new_tokens"] == 40
    clone = _post(api, f"/api/v1/runs/{source.id}/clone", {"config": {"steps": 5}})
    assert clone.status_code == 201
    (copy,) = clone.json()["runs"]
    copied = Run.objects.get(pk=copy["id"])
    assert copy["name"] == f"{source.name} (clone)" and copy["tags"] == ["api"]
    assert copied.config == source.config | {"steps": 5}


def test_cancel_and_resume_answer_with_the_run_and_refuse_what_cannot_be_done(api, launcher, checkpoint):
    run = make_run(launcher)
    cancelled = _post(api, f"/api/v1/runs/{run.id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = _post(api, f"/api/v1/runs/{run.id}/cancel")
    assert again.status_code == 409 and again.json() == {"detail": "this run has already cancelled"}
    assert _post(api, f"/api/v1/runs/{run.id}/resume").status_code == 409  # no checkpoint
    Run.objects.filter(pk=run.pk).update(checkpoint_dir=checkpoint)
    resumed = _post(api, f"/api/v1/runs/{run.id}/resume")
    assert resumed.status_code == 201 and Run.objects.get(pk=resumed.json()["id"]).resume_from == checkpoint


def test_a_run_in_a_phase_reports_it_and_an_ended_run_reports_none(api, launcher):
    run = make_run(launcher)
    phase = {"step": 3, "phase": "checkpoint", "done": 0, "total": 1, "at": 1.0}
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, progress=phase)
    assert api.get(f"/api/v1/runs/{run.id}").json()["progress"] == phase
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)  # its last report stays in the row
    assert api.get(f"/api/v1/runs/{run.id}").json()["progress"] == {}

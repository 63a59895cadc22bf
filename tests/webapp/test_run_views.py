"""Run pages and actions as owner, other user and anonymous: launch (N seeds, clone, resume), list, cancel,
the live run page, the trajectory inspector and the worker indicator."""

from __future__ import annotations

import json
import re
import socket

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from trainer.config import get_preset
from webapp.forms import SeedListField, seed_ranges
from webapp.models import EpisodeRecord, MetricRow, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def launcher(user):
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


def _launch_data(**changes) -> dict:
    cfg = get_preset("cpu")
    data = {
        "name": "my run", "preset": "cpu", "env": cfg.env, "method": cfg.method,
        "actor_model": cfg.actor.model_path, "extractor_model": cfg.extractor.model_path,
        "k_rollouts": cfg.k_rollouts, "tasks_per_step": cfg.tasks_per_step, "steps": 3,
        "actor_lr": cfg.actor.lr, "extractor_lr": cfg.extractor.lr, "turn_limit": 8, "seed": 5,
        "n_seeds": 1, "eval_every": 2, "overrides": "", "tags": "smoke, cpu",
        "base": json.dumps(cfg.to_dict()),
    }  # fmt: skip
    return data | changes


def _run(owner, **fields) -> Run:
    return Run.objects.create(
        name=fields.pop("name", "r"), owner=owner, config=get_preset("cpu").to_dict(), **fields
    )


# ---- launch ----------------------------------------------------------------------------------------


def test_anonymous_users_are_sent_to_login_from_every_run_page(client, user):
    run = _run(user)
    for url in [
        reverse("home"), reverse("run_launch"), reverse("workers"), reverse("run_detail", args=[run.id]),
        reverse("run_inspect", args=[run.id]), reverse("compare") + f"?runs={run.id}",
        reverse("compare_csv") + f"?runs={run.id}",
    ]:  # fmt: skip
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), url
    for url in [reverse("run_cancel", args=[run.id]), reverse("run_resume", args=[run.id])]:
        assert client.post(url).status_code == 302
    assert Run.objects.get().status == Run.Status.QUEUED


def test_launching_needs_the_permission(client, user):
    client.force_login(user)
    assert client.get(reverse("run_launch")).status_code == 403
    assert client.post(reverse("run_launch"), _launch_data()).status_code == 403
    assert not Run.objects.exists()


def test_the_launch_form_starts_from_the_cpu_preset_and_can_switch_preset(client, launcher):
    client.force_login(launcher)
    page = client.get(reverse("run_launch")).content.decode()
    assert (
        'name="k_rollouts"' in page
        and 'value="8"' in page
        and "MiniHack-Room-5x5" in page
        and "3-task" in page
    )
    partial = client.get(
        reverse("run_launch"), {"preset": "paper"}, headers={"HX-Request": "true"}
    ).content.decode()
    assert partial.startswith('<form id="launch-form"') and "Qwen/Qwen2.5-7B-Instruct" in partial


def test_a_valid_launch_queues_one_run_with_the_checked_config_and_enqueues_it_on_commit(
    client, launcher, django_capture_on_commit_callbacks
):
    client.force_login(launcher)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("run_launch"), _launch_data(overrides="rollout.max_new_tokens=32"))
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("run_detail", args=[run.id])
    assert (run.name, run.status, run.method, run.env, run.seed) == (
        "my run",
        "queued",
        "complementary",
        "MiniHack-Room-5x5",
        5,
    )
    assert run.tags == ["smoke", "cpu"] and run.owner == launcher
    assert run.config["steps"] == 3 and run.config["rollout"]["turn_limit"] == 8
    assert run.config["rollout"]["max_new_tokens"] == 32
    assert run.config["experience"]["warmup_steps"] == 2  # kept from the preset (no field for it)
    assert len(callbacks) == 1


def test_launching_n_seeds_creates_n_runs_with_consecutive_seeds(
    client, launcher, django_capture_on_commit_callbacks
):
    client.force_login(launcher)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("run_launch"), _launch_data(n_seeds=3, seed=10))
    assert response.status_code == 302 and response["Location"] == reverse("home")
    runs = Run.objects.order_by("seed")
    assert [r.seed for r in runs] == [10, 11, 12] and [r.config["seed"] for r in runs] == [10, 11, 12]
    assert runs[0].name == "my run · seed 10" and len(callbacks) == 3


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"k_rollouts": 7}, "k_rollouts", "K (rollouts per task) must be even"),
        ({"actor_lr": -1}, "actor_lr", "Actor learning rate must be above 0"),
        ({"steps": 0}, "steps", "Steps must be at least 1"),
        ({"env": "NoSuchEnv"}, "env", "Select a valid choice"),
        ({"method": "grpo", "no_merge": "on"}, "no_merge", "uses none"),
        ({"n_seeds": 99}, "n_seeds", "less than or equal to 16"),
        ({"overrides": "rollout.max_new_tokens"}, "overrides", "write key=value"),
        ({"overrides": "rollout.nope=1"}, "overrides", "unknown config key"),
        ({"k_rollouts": "many"}, "k_rollouts", "Enter a whole number"),
    ],
)
def test_the_launch_form_rejects_bad_input_next_to_the_field_and_creates_nothing(
    client, launcher, changes, field, words
):
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), _launch_data(**changes))
    assert response.status_code == 400
    page = response.content.decode()
    start = page.index(f'id="error-{field}"')
    assert words in page[start : start + 400]
    assert not Run.objects.exists()


def test_a_tampered_base_config_is_rejected(client, launcher):
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), _launch_data(base="{not json"))
    assert response.status_code == 400 and "not valid JSON" in response.content.decode()
    assert not Run.objects.exists()


def test_clone_prefills_the_form_from_a_visible_run_and_hides_others_private_runs(
    client, launcher, other_user
):
    cfg = get_preset("cpu").with_overrides(k_rollouts=6, **{"rollout.max_new_tokens": 40})
    mine = Run.objects.create(name="base <b>", owner=launcher, config=cfg.to_dict(), tags=["x"])
    private = _run(other_user)
    shared = _run(other_user, shared=True)
    client.force_login(launcher)
    page = client.get(reverse("run_launch"), {"clone": mine.id}).content.decode()
    assert 'value="base &lt;b&gt; (clone)"' in page and 'name="k_rollouts" value="6"' in page
    assert "&quot;max_new_tokens&quot;: 40" in page  # the whole config travels in the hidden base field
    assert client.get(reverse("run_launch"), {"clone": private.id}).status_code == 404
    assert client.get(reverse("run_launch"), {"clone": shared.id}).status_code == 200


# ---- list, filters, worker indicator -----------------------------------------------------------------


def test_the_list_filters_and_sorts_and_hides_others_private_runs(client, user, other_user):
    a = _run(user, name="alpha", method="grpo", status=Run.Status.SUCCEEDED, tags=["base"])
    b = _run(user, name="beta", method="complementary", step=7)
    _run(other_user, name="gamma-private")
    _run(other_user, name="delta-shared", shared=True)
    MetricRow.objects.create(run=a, step=0, wall_time=1, values={"train/success": 0.25})
    MetricRow.objects.create(run=b, step=0, wall_time=1, values={"train/success": 0.75})
    client.force_login(user)
    page = client.get(reverse("home")).content.decode()
    assert "alpha" in page and "beta" in page and "delta-shared" in page and "gamma-private" not in page
    assert "0.75" in page
    page = client.get(reverse("home"), {"method": "grpo"}).content.decode()
    assert "alpha" in page and "beta" not in page
    page = client.get(reverse("home"), {"tag": "base"}).content.decode()
    assert "alpha" in page and "beta" not in page
    page = client.get(
        reverse("home"), {"mine": "on", "sort": "success"}, headers={"HX-Request": "true"}
    ).content.decode()
    assert page.startswith('<div id="run-list">') and "delta-shared" not in page
    assert page.index("beta") < page.index("alpha")
    page = client.get(reverse("home"), {"status": "exploded"}, follow=True).content.decode()
    assert "not understood" in page and "alpha" in page


def test_a_running_run_without_heartbeat_shows_as_lost(client, user):
    _run(
        user,
        name="stuck",
        status=Run.Status.RUNNING,
        heartbeat_at=timezone.now() - timezone.timedelta(minutes=10),
    )
    client.force_login(user)
    assert 'class="status lost"' in client.get(reverse("home")).content.decode()


def test_the_status_filter_tells_lost_runs_from_running_ones(client, user):
    stale = timezone.now() - timezone.timedelta(minutes=10)
    _run(user, name="stuck-run", status=Run.Status.RUNNING, heartbeat_at=stale)
    _run(user, name="beating-run", status=Run.Status.RUNNING, heartbeat_at=timezone.now())
    gone = f"w@{socket.gethostname()}:{2**22 + 1}"  # above Linux's largest pid: no such process
    _run(user, name="orphan-run", status=Run.Status.RUNNING, heartbeat_at=timezone.now(), worker=gone)
    client.force_login(user)
    lost = client.get(reverse("home"), {"status": "lost"}).content.decode()
    assert "stuck-run" in lost and "orphan-run" in lost and "beating-run" not in lost
    assert '<option value="lost" selected>' in lost
    running = client.get(reverse("home"), {"status": "running"}).content.decode()
    assert "beating-run" in running and "stuck-run" not in running and "orphan-run" not in running


def test_the_worker_indicator_counts_queued_runs(client, user):
    _run(user)
    _run(user, status=Run.Status.FAILED)
    client.force_login(user)
    page = client.get(reverse("workers")).content.decode()
    assert 'id="workers"' in page and "1 queued run" in page and "online" in page


# ---- cancel and resume -------------------------------------------------------------------------------


def test_the_owner_cancels_a_queued_run_from_the_list(client, user):
    run = _run(user)
    client.force_login(user)
    response = client.post(
        reverse("run_cancel", args=[run.id]), headers={"HX-Request": "true", "HX-Target": f"run-row-{run.id}"}
    )
    assert response.status_code == 200 and response.content.decode().startswith(f'<tr id="run-row-{run.id}">')
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.cancel_requested and run.finished_at


def test_cancelling_a_running_run_asks_its_worker_to_stop(client, user):
    run = _run(user, status=Run.Status.RUNNING, heartbeat_at=timezone.now())
    client.force_login(user)
    response = client.post(reverse("run_cancel", args=[run.id]), follow=True)
    assert "Cancellation requested" in response.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.cancel_requested


def test_cancelling_a_lost_run_closes_it(client, user):
    run = _run(user, status=Run.Status.RUNNING, heartbeat_at=timezone.now() - timezone.timedelta(hours=1))
    client.force_login(user)
    client.post(reverse("run_cancel", args=[run.id]))
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and "lost" in run.error


def test_a_finished_run_cannot_be_cancelled(client, user):
    run = _run(user, status=Run.Status.SUCCEEDED)
    client.force_login(user)
    response = client.post(reverse("run_cancel", args=[run.id]), headers={"HX-Request": "true"})
    assert response.status_code == 409 and "already succeeded" in response.content.decode()
    assert Run.objects.get().status == Run.Status.SUCCEEDED


def test_other_users_cannot_cancel_or_resume(client, user, other_user):
    private = _run(other_user)
    shared = _run(other_user, shared=True, status=Run.Status.FAILED, checkpoint_dir="/tmp/ckpt")
    client.force_login(user)
    assert client.post(reverse("run_cancel", args=[private.id])).status_code == 404
    assert client.post(reverse("run_cancel", args=[shared.id])).status_code == 403
    assert client.post(reverse("run_resume", args=[shared.id])).status_code == 403
    assert client.get(reverse("run_cancel", args=[private.id])).status_code in (404, 405)
    assert Run.objects.filter(status=Run.Status.QUEUED).count() == 1 and Run.objects.count() == 2


def test_resume_queues_a_new_run_from_the_checkpoint(
    client, launcher, django_capture_on_commit_callbacks, tmp_path
):
    checkpoint = tmp_path / "checkpoints" / "step-000007"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text("{}")
    run = _run(launcher, name="long", status=Run.Status.FAILED, checkpoint_dir=str(tmp_path), tags=["t"])
    client.force_login(launcher)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("run_resume", args=[run.id]))
    resumed = Run.objects.exclude(pk=run.pk).get()
    assert response["Location"] == reverse("run_detail", args=[resumed.id]) and len(callbacks) == 1
    assert (
        resumed.resume_from == str(tmp_path)
        and resumed.config == run.config
        and resumed.name == "long (resumed)"
    )


def test_resume_without_a_checkpoint_says_why_and_creates_nothing(client, launcher):
    run = _run(launcher, status=Run.Status.FAILED)
    client.force_login(launcher)
    page = client.post(reverse("run_resume", args=[run.id]), follow=True).content.decode()
    assert "no checkpoint" in page and Run.objects.count() == 1


# ---- run page -----------------------------------------------------------------------------------------


def test_the_run_page_shows_curves_config_environment_and_errors_to_the_owner(client, user):
    run = _run(user, name="<i>run</i>", status=Run.Status.FAILED, error="CUDA out of memory <x>",
               environment={"git": "abc123", "packages": {"torch": "2.13.0"}})  # fmt: skip
    for step in range(5):
        values = {"train/guided/success": step / 4, "actor/loss": 1.0 - step / 10, "note": "x"}
        MetricRow.objects.create(run=run, step=step, wall_time=step * 2.0, values=values)
    MetricRow.objects.create(
        run=run, step=4, kind="eval", wall_time=9, values={"eval/with_exp/success": 0.5, "eval/success": 0.25}
    )
    client.force_login(user)
    page = client.get(reverse("run_detail", args=[run.id])).content.decode()
    assert "&lt;i&gt;run&lt;/i&gt;" in page and "<i>run</i>" not in page
    assert "CUDA out of memory &lt;x&gt;" in page and "abc123" in page and "torch" in page
    assert "k_rollouts" in page and "actor.lr" in page
    data = json.loads(
        page.split('<script id="run-metrics" type="application/json">')[1].split("</script>")[0]
    )
    assert data["series"]["train"]["step"] == [0, 1, 2, 3, 4]
    assert data["series"]["train"]["values"]["train/guided/success"] == [0, 0.25, 0.5, 0.75, 1.0]
    assert "note" not in data["series"]["train"]["values"]  # text values are not plotted
    assert [p["id"] for p in data["panels"]] == ["success", "eval-success", "actor"]
    assert data["cursor"] == MetricRow.objects.latest("id").id


def test_the_run_page_warns_of_optimiser_steps_skipped_for_a_gradient_norm_that_was_not_finite(client, user):
    run = _run(user)
    for step, actor, extractor in [(0, 0.0, 0.0), (1, 1.0, 0.0), (2, 1.0, 1.0), (3, 1.0, 0.0), (4, 0.0, 0.0)]:
        values = {"actor/nonfinite_grad_steps": actor, "extractor/nonfinite_grad_steps": extractor}
        MetricRow.objects.create(run=run, step=step, wall_time=float(step), values=values)
    client.force_login(user)
    why = (
        "because the gradient norm was not finite (NaN or inf); lower the learning rate or check the "
        "run&#x27;s data."
    )
    for response in (
        client.get(reverse("run_detail", args=[run.id])),
        client.get(
            reverse("run_detail", args=[run.id]), headers={"HX-Request": "true", "HX-Target": "run-header"}
        ),
    ):
        page = response.content.decode()
        assert (
            f'<p class="error" id="run-skipped-actor-steps">3 actor optimiser steps were skipped {why}</p>'
            in page
        )
        assert f'id="run-skipped-extractor-steps">1 extractor optimiser step was skipped {why}</p>' in page


def test_the_run_page_has_no_skipped_step_warning_when_every_optimiser_step_was_taken(client, user):
    run = _run(user)
    for step in range(3):
        values = {"actor/nonfinite_grad_steps": 0.0, "extractor/nonfinite_grad_steps": 0.0, "actor/loss": 1.0}
        MetricRow.objects.create(run=run, step=step, wall_time=float(step), values=values)
    MetricRow.objects.create(
        run=_run(user), step=0, wall_time=0.0, values={"actor/nonfinite_grad_steps": 1.0}
    )
    client.force_login(user)
    page = client.get(reverse("run_detail", args=[run.id])).content.decode()
    assert "run-skipped" not in page and "optimiser step" not in page


def test_long_runs_are_thinned_on_the_server_to_a_row_per_bucket_and_the_newest(client, user):
    run = _run(user)
    MetricRow.objects.bulk_create(
        MetricRow(run=run, step=s, wall_time=float(s), values={"train/success": s / 10000})
        for s in range(3001)
    )
    client.force_login(user)
    page = client.get(reverse("run_detail", args=[run.id])).content.decode()
    data = json.loads(page.split('type="application/json">')[1].split("</script>")[0])
    train = data["series"]["train"]
    assert train["bucket"] == 4 and len(train["step"]) == 751
    assert train["step"][:2] == [3, 7] and train["step"][-2:] == [2999, 3000]
    assert train["values"]["train/success"][:2] == [0.0003, 0.0007]
    assert data["cursor"] == MetricRow.objects.latest("id").id
    assert "one point every 4 steps" in page


def test_run_page_visibility(client, user, other_user):
    private = _run(other_user)
    shared = _run(other_user, shared=True)
    client.force_login(user)
    assert client.get(reverse("run_detail", args=[private.id])).status_code == 404
    page = client.get(reverse("run_detail", args=[shared.id])).content.decode()
    assert "Cancel run" not in page  # visible, but not theirs to manage
    assert client.get(reverse("run_detail", args=[999999])).status_code == 404


def test_the_live_regions_of_the_run_page_are_served_as_partials(client, user, tmp_path):
    from experience.models import SearchAsk

    run = _run(user, step=3)
    SearchAsk.objects.create(
        run=run, scope="shared", query="how to open <door>", refined="use the key", step=3,
        episode_id="3/MiniHack-Room-5x5/7/2/123",  # step/env/seed/group/sample seed (coevolution.episode_id)
    )  # fmt: skip
    client.force_login(user)
    url = reverse("run_detail", args=[run.id])
    header = client.get(url, headers={"HX-Request": "true", "HX-Target": "run-header"}).content.decode()
    assert header.startswith('<section id="run-header"') and 'id="run-step">3<' in header
    feed = client.get(url, headers={"HX-Request": "true", "HX-Target": "trace-feed"}).content.decode()
    assert (
        feed.startswith('<div id="trace-feed"')
        and "how to open &lt;door&gt;" in feed
        and "use the key" in feed
    )
    link = f"{reverse('run_inspect', args=[run.id])}?step=3#task-2"  # the card of its task instance
    assert f'href="{link}"' in feed and client.get(link.split("#")[0]).status_code == 200

    MetricRow.objects.create(run=run, kind="eval", step=3, wall_time=9.0, values={"eval/success": 0.25})
    latest = client.get(url, headers={"HX-Request": "true", "HX-Target": "latest-eval"}).content.decode()
    assert 'id="latest-eval"' in latest and "(step 3)" in latest and "eval/success" in latest
    Run.objects.filter(pk=run.pk).update(worker="w1@host")
    env = client.get(url, headers={"HX-Request": "true", "HX-Target": "environment"}).content.decode()
    assert env.startswith('<section class="card" id="environment"') and "w1@host" in env
    (tmp_path / "log.txt").write_text("".join(f"step {i} <b>ok</b>\n" for i in range(1, 301)))
    Run.objects.filter(pk=run.pk).update(checkpoint_dir=str(tmp_path))
    log = client.get(url, headers={"HX-Request": "true", "HX-Target": "run-log"}).content.decode()
    assert 'id="run-log"' in log and "step 300 &lt;b&gt;ok&lt;/b&gt;" in log  # the tail, escaped
    assert "step 101 " in log and "step 100 " not in log  # the last 200 lines


# ---- trajectory inspector -----------------------------------------------------------------------------


def _episode(run, step, task, guided, reward, **fields) -> EpisodeRecord:
    fields.setdefault("turns", [{"observation": "a room", "action": "north", "reward": 0}])
    return EpisodeRecord.objects.create(
        run=run, step=step, task_instance=task, env="MiniHack-Room-5x5", seed=task, guided=guided,
        reward=reward, success=reward > 0, num_actions=2, **fields,
    )  # fmt: skip


def test_the_inspector_groups_a_steps_episodes_by_task_and_subgroup(client, user, other_user):
    run = _run(user)
    _episode(run, 1, 0, True, 1.0, injected_experience="go to the stairs <fast>", experience_id=9)
    turns = [
        {
            "observation": "dark",
            "action_text": "<search>stairs?</search>",
            "action": None,
            "intercepted": True,
        },
        {"observation": "Refined: east", "action_text": "east <x>", "action": "east", "reward": 0.0},
    ]
    _episode(run, 1, 0, False, 0.0, turns=turns)
    _episode(run, 1, 1, True, 0.0)
    _episode(run, 2, 0, True, 1.0)
    client.force_login(user)
    page = client.get(reverse("run_inspect", args=[run.id]), {"step": 1}).content.decode()
    assert 'id="task-0"' in page and 'id="task-1"' in page
    assert "With experience (1)" in page and "Without experience (1)" in page
    assert "go to the stairs &lt;fast&gt;" in page and "east &lt;x&gt;" in page
    assert "&lt;search&gt;stairs?&lt;/search&gt;" in page and page.count("Search-and-Ask exchange") == 1
    assert page.index("Refined: east") < page.index("east &lt;x&gt;")  # observation before the action
    assert 'class="histogram"' in page and page.count('class="bin"') == 10
    latest = client.get(reverse("run_inspect", args=[run.id])).content.decode()
    assert "Rewards at step 2" in latest
    assert (
        "has no recorded episodes"
        in client.get(reverse("run_inspect", args=[run.id]), {"step": 7}).content.decode()
    )
    client.force_login(other_user)
    assert client.get(reverse("run_inspect", args=[run.id])).status_code == 404


def test_the_log_tail_of_a_long_log_starts_on_a_whole_line(tmp_path):
    from webapp.selectors import run_log_tail

    (tmp_path / "log.txt").write_text("".join(f"step {i} " + "x" * 500 + "\n" for i in range(1, 1001)))
    tail = run_log_tail(Run(checkpoint_dir=str(tmp_path)), lines=50).splitlines()
    assert len(tail) == 50 and tail[0].startswith("step 951 ") and tail[-1].startswith("step 1000 ")
    assert run_log_tail(Run(checkpoint_dir=str(tmp_path / "missing"))) == ""


def test_the_launch_form_launches_an_experiment_grid_of_methods_by_seeds(
    client, launcher, monkeypatch, django_capture_on_commit_callbacks
):
    queued: list[int] = []
    monkeypatch.setattr("webapp.queueing._enqueue", queued.append)
    client.force_login(launcher)
    data = _launch_data(experiment="form-grid", experiment_methods=["grpo", "complementary"],
                        experiment_seeds="0, 2")  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("run_launch"), data)
    assert response.status_code == 302 and response["Location"] == reverse(
        "experiment_detail", args=["form-grid"]
    )
    runs = Run.objects.filter(experiment__name="form-grid")
    assert sorted(runs.values_list("cell", flat=True)) == ["complementary/s0", "complementary/s2", "grpo/s0",
                                                            "grpo/s2"]  # fmt: skip
    assert sorted(queued) == sorted(runs.values_list("pk", flat=True))
    assert {r.config["steps"] for r in runs} == {3} and {r.owner for r in runs} == {launcher}
    page = client.get(response["Location"]).content.decode()
    assert "complementary" in page and "seed 2" in page

    again = client.post(reverse("run_launch"), data)  # same name: refused, nothing queued
    assert again.status_code == 400 and "you have an experiment called" in again.content.decode()
    bad = client.post(reverse("run_launch"), _launch_data(experiment="x", experiment_methods=["grpo"]))
    assert bad.status_code == 400 and "choose at least one seed" in bad.content.decode()
    assert Run.objects.count() == 4


@pytest.mark.parametrize(
    ("changes", "field_text"),
    [
        ({"overrides": "actor.lr=nan"}, "actor.lr has its own field"),
        ({"overrides": "steps=5"}, "steps has its own field"),
        ({"base": "[" * 100_000 + "]" * 100_000}, "base config"),
        ({"base": "[" * 20_000 + "]" * 20_000}, "base config"),
    ],
)
def test_launch_input_that_used_to_crash_is_refused_next_to_its_field(client, launcher, changes, field_text):
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), _launch_data(**changes))
    assert response.status_code == 400 and field_text in response.content.decode()
    assert not Run.objects.exists()


def test_a_clone_id_that_is_not_a_plain_number_is_refused_with_a_message(client, launcher):
    client.force_login(launcher)
    response = client.get(reverse("run_launch") + "?clone=%C2%B2")
    assert response.status_code == 400 and "clone must be a whole number" in response.content.decode()


@pytest.mark.parametrize(
    "model", ["../../etc/passwd", "/nonexistent", "/etc", "Qwen/Qwen2.5-7B-Instruct", "~0", "~nobody-here/m"]
)
def test_a_launch_names_only_prepared_models(client, launcher, model):
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), _launch_data(actor_model=model))
    assert response.status_code == 400 and "prepared" in response.content.decode()
    assert not Run.objects.exists()


def test_an_admin_allowed_folder_and_hub_ids_can_be_opened_up(client, launcher, settings, tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    settings.STUDIO_MODEL_DIRS = [str(tmp_path)]
    settings.STUDIO_ALLOW_HUB_MODELS = True
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), _launch_data(actor_model=str(model),
                                                                extractor_model="Qwen/Qwen3-4B"))  # fmt: skip
    assert response.status_code == 302
    run = Run.objects.get()
    assert (
        run.config["actor"]["model_path"] == str(model)
        and run.config["extractor"]["model_path"] == "Qwen/Qwen3-4B"
    )


@pytest.mark.parametrize("token", ["\x00", "not-hex", "f" * 65])
def test_a_malformed_submission_token_is_a_form_error_not_a_crash(client, launcher, token):
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), _launch_data(submission=token))
    assert response.status_code == 400 and not Run.objects.exists()


def test_the_same_form_submission_posted_twice_launches_once(client, launcher):
    client.force_login(launcher)
    page = client.get(reverse("run_launch")).content.decode()
    token = re.search(r'name="submission" value="([0-9a-f]+)"', page).group(1)
    first = client.post(reverse("run_launch"), _launch_data(submission=token, n_seeds=2))
    second = client.post(reverse("run_launch"), _launch_data(submission=token, n_seeds=2), follow=True)
    assert first.status_code == 302 and Run.objects.count() == 2
    assert "submitted already" in second.content.decode()
    other = client.get(reverse("run_launch")).content.decode()
    assert token not in other  # every showing of the form gets its own token


def test_the_launch_link_shows_for_the_launch_permission_alone(client, launcher, other_user):
    client.force_login(launcher)
    assert f'href="{reverse("run_launch")}"' in client.get(reverse("home")).content.decode()
    client.force_login(other_user)
    assert f'href="{reverse("run_launch")}"' not in client.get(reverse("home")).content.decode()


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("0-4", [0, 1, 2, 3, 4]),
        ("0, 2 7", [0, 2, 7]),
        ("3-3, 1", [1, 3]),
        (["1", "0"], [0, 1]),
        ([4, 2], [2, 4]),
    ],
)
def test_seeds_are_written_as_numbers_and_ranges(text, seeds):
    field = SeedListField()
    assert field.to_python(text) == seeds and field.to_python(seed_ranges(seeds)) == seeds


@pytest.mark.parametrize(
    ("text", "words"),
    [("0-20", "at most 16 seeds"), ("9999999999", r"below 2\^31"), ("5-2", "runs up"),
     ("a", "numbers and ranges"), ("１", "numbers and ranges"), ("0-9, 10-16", "at most 16 seeds"),
     ("-1", "numbers and ranges")],
)  # fmt: skip
def test_seeds_that_cannot_be_read_are_refused_with_the_part_named(text, words):
    with pytest.raises(ValidationError, match=words):
        SeedListField().to_python(text)

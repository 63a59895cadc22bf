"""The plan on the launch form and the refusal of launches that fit no worker, on the page and from
``manage.py train``: the four resource-absurd values of issue 37 and the paper preset on this box are refused
with the plan's numbers and launch nothing; a config that fits is launched as asked."""

from __future__ import annotations

import html
import json

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.urls import reverse

from tests.webapp.test_worker_devices import registry_of_its_own, worker  # noqa: F401 - a fixture
from trainer.config import RunConfig, get_preset
from webapp.models import Run
from webapp.workers import check, register, stand_in

pytestmark = pytest.mark.django_db

ABSURD = {
    "a 4 TiB KV cache": {"rollout.kv_cache_gib": 4096},
    "a million-token context": {"rollout.max_new_tokens": 32768, "rollout.context_tokens": 1048576},
    "100,000 evaluation episodes": {"eval_episodes": 100000},
    "16,384 rollouts a step": {"tasks_per_step": 4096, "k_rollouts": 4},
}
FIELDS = {"tasks_per_step", "k_rollouts"}
"""Keys with a field of their own on the form (the others go in its overrides box)."""


@pytest.fixture
def launcher(user, settings):
    settings.STUDIO_ALLOW_HUB_MODELS = True  # the paper preset names its models by hub id
    user.user_permissions.add(Permission.objects.get(codename="launch_run", content_type__app_label="webapp"))
    return user


def form_data(cfg: RunConfig, preset: str = "cpu", **fields) -> dict:
    """What the launch form posts for ``cfg`` (its own fields; the rest rides in the hidden base)."""
    data = {
        "name": "", "preset": preset, "env": cfg.env, "method": cfg.method,
        "actor_model": cfg.actor.model_path, "extractor_model": cfg.extractor.model_path,
        "k_rollouts": cfg.k_rollouts, "tasks_per_step": cfg.tasks_per_step, "steps": cfg.steps,
        "actor_lr": cfg.actor.lr, "extractor_lr": cfg.extractor.lr,
        "turn_limit": cfg.rollout.turn_limit or "", "seed": cfg.seed, "n_seeds": 1,
        "eval_every": cfg.eval_every, "nproc": cfg.nproc, "overrides": "",
        "tags": "", "base": json.dumps(cfg.to_dict()),
    }  # fmt: skip
    return data | fields


def absurd_form(changes: dict) -> tuple[RunConfig, dict]:
    cfg = get_preset("cpu").with_overrides(**changes)
    fields = {k: v for k, v in changes.items() if k in FIELDS}
    overrides = "\n".join(f"{k}={v}" for k, v in changes.items() if k not in FIELDS)
    return cfg, form_data(get_preset("cpu"), overrides=overrides, **fields)


CASES = [*ABSURD, "the paper preset"]


def case(name: str) -> tuple[RunConfig, dict]:
    if name == "the paper preset":
        paper = get_preset("paper")
        return paper, form_data(paper, preset="paper")
    return absurd_form(ABSURD[name])


@pytest.mark.parametrize("name", CASES)
def test_the_form_refuses_a_launch_that_fits_no_worker_with_the_plans_numbers(client, launcher, name):
    cfg, data = case(name)
    why = check(cfg, stand_in()).why_not
    assert why is not None and " per device; the worker has 1 × " in why
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), data)
    page = response.content.decode()
    assert response.status_code == 400 and not Run.objects.exists()
    assert "no worker can run this launch (this machine (no worker has registered))" in html.unescape(page)
    assert html.escape(why) in page


@pytest.mark.parametrize("name", CASES)
def test_manage_py_train_refuses_the_same_launches_before_anything_loads(name):
    cfg, _ = case(name)
    if name == "the paper preset":
        args = ["--config", "paper"]
    else:
        args = ["--config", "cpu", *(a for k, v in ABSURD[name].items() for a in ("--set", f"{k}={v}"))]
    with pytest.raises(CommandError) as refused:
        call_command("train", *args, "--steps", "1")
    assert str(refused.value).startswith(f"refused: this machine ({stand_in().devices.describe()}) cannot")
    assert check(cfg, stand_in()).why_not in str(refused.value)
    assert not Run.objects.exists()


def test_a_launch_that_fits_is_queued_with_exactly_the_config_asked_for(client, launcher):
    cpu = get_preset("cpu")
    data = form_data(cpu, steps=4, tasks_per_step=2, overrides="rollout.max_new_tokens=24\neval_episodes=8")
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), data)
    run = Run.objects.get()
    assert response.status_code == 302
    asked = cpu.with_overrides(
        steps=4, tasks_per_step=2, **{"rollout.max_new_tokens": 24, "eval_episodes": 8}
    )
    assert run.config == asked.to_dict()


def test_the_nproc_field_reaches_the_config_and_an_empty_one_keeps_the_starting_value(client, launcher):
    small = get_preset("cpu").with_overrides(method="grpo", tasks_per_step=2, k_rollouts=2)
    client.force_login(launcher)
    assert client.post(reverse("run_launch"), form_data(small, nproc=2)).status_code == 302
    assert client.post(reverse("run_launch"), form_data(small, nproc="")).status_code == 302
    assert [r.config["nproc"] for r in Run.objects.order_by("id")] == [2, 1]
    refused = client.post(reverse("run_launch"), form_data(small, nproc=64))
    assert (
        refused.status_code == 400 and "it asks for 64 processes; the worker has" in refused.content.decode()
    )


def test_the_plan_partial_shows_the_table_for_a_launch_that_fits_and_the_refusal_for_one_that_does_not(
    client, launcher
):
    client.force_login(launcher)
    page = client.get(reverse("run_launch")).content.decode()
    assert f'hx-post="{reverse("run_launch_plan")}"' in page and "from:closest form delay:400ms" in page
    fits = client.post(reverse("run_launch_plan"), form_data(get_preset("cpu"))).content.decode()
    plan = check(get_preset("cpu"), stand_in()).plan
    assert 'id="plan-verdict">Fits:' in fits and f"{plan.device_bytes() / 1e9:,.1f} GB" in fits
    assert all(html.escape(p.name) in fits for p in plan.parts) and "Time per step ~" in fits
    refused = client.post(reverse("run_launch_plan"), absurd_form(ABSURD["a 4 TiB KV cache"])[1])
    assert 'id="plan-refusal">Refused: no worker can run this launch' in refused.content.decode()
    broken = client.post(reverse("run_launch_plan"), form_data(get_preset("cpu"), k_rollouts=3))
    page = broken.content.decode()
    assert 'id="plan-pending"' in page and "K (rollouts per task)" in page
    assert not Run.objects.exists()


def test_the_plan_partial_needs_the_launch_permission(client, user):
    client.force_login(user)
    assert client.post(reverse("run_launch_plan"), form_data(get_preset("cpu"))).status_code == 403


def test_a_launch_goes_by_the_registered_workers_not_this_machine(client, launcher):
    register(worker("big@x", "cpu:512GB"))
    cfg, data = absurd_form({"rollout.kv_cache_gib": 64})  # ~90 GB: too big here, fine on that worker
    client.force_login(launcher)
    response = client.post(reverse("run_launch"), data)
    assert response.status_code == 302 and Run.objects.get().config == cfg.to_dict()
    register(worker("small@y", "cpu:16GB"))  # now it fits one worker of two
    plan = client.post(reverse("run_launch_plan"), data).content.decode()
    assert "big@x.training" in plan and "small@y (1 × 16 GB RAM): cannot run it: it needs" in plan


def test_the_run_page_and_the_config_diff_show_nproc_and_device_like_any_other_key(client, user):
    one = get_preset("cpu").to_dict()
    two = get_preset("cpu").with_overrides(nproc=2, device="cpu").to_dict()
    runs = [Run.objects.create(name=f"r{i}", owner=user, config=c) for i, c in enumerate((one, two))]
    client.force_login(user)
    page = client.get(reverse("run_detail", args=[runs[1].id])).content.decode()
    assert "<th>nproc</th><td>2</td>" in page and "<th>device</th><td>cpu</td>" in page
    compare = client.get(reverse("compare"), {"runs": [r.id for r in runs]}).content.decode()
    diff = compare[compare.index('id="config-diff"') :]
    assert "<tr><th>nproc</th><td>1</td><td>2</td></tr>" in diff
    assert "<tr><th>device</th><td>auto</td><td>cpu</td></tr>" in diff

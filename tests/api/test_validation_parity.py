"""The API judges a launch with the launch form itself: the same bad launch is refused by both, with the
same message, and launches nothing."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.api.conftest import bearer
from trainer.config import get_preset
from webapp.forms import config_initial
from webapp.models import Run

pytestmark = pytest.mark.django_db


def _form_data(**changes) -> dict:
    data = config_initial(get_preset("cpu")) | {"preset": "cpu", "name": "", "n_seeds": 1, "overrides": ""}
    return {k: v for k, v in (data | changes).items() if v is not None}


CASES = [
    # (API config, API launch fields, form changes, form field, API error key)
    ({"k_rollouts": 5}, {}, {"k_rollouts": 5}, "k_rollouts", "k_rollouts"),
    ({"rollout.max_new_tokenz": 5}, {}, {"overrides": "rollout.max_new_tokenz=5"}, "overrides", "config"),
    ({"actor": {"model_path": "/etc"}}, {}, {"actor_model": "/etc"}, "actor_model", "actor.model_path"),
    ({"method": "grpo", "cross_group": True}, {}, {"method": "grpo", "cross_group": "on"}, "cross_group",
     "cross_group"),
    ({}, {"n_seeds": 99}, {"n_seeds": 99}, "n_seeds", "n_seeds"),
    ({"eval_every": -1}, {}, {"eval_every": -1}, "eval_every", "eval_every"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "fields", "form_changes", "form_field", "api_key"), CASES)
def test_the_form_and_the_api_refuse_a_bad_launch_with_the_same_message_in_their_own_words(
    client, launcher, config, fields, form_changes, form_field, api_key
):
    client.force_login(launcher)
    page = client.post(reverse("run_launch"), _form_data(**form_changes))
    assert page.status_code == 400
    form_messages = page.context["form"].errors[form_field]
    response = client.post("/api/v1/runs", {"config": config, **fields}, content_type="application/json",
                           headers=bearer(launcher))  # fmt: skip
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert list(errors) == [api_key]
    # the same message; the page names a setting by its field's label, the API by its config key
    assert [page.context["form"]._in_form_words(m) for m in errors[api_key]] == form_messages
    assert not Run.objects.exists()


def test_a_valid_launch_is_queued_alike_by_both(client, launcher):
    client.force_login(launcher)
    assert client.post(reverse("run_launch"), _form_data(steps=3, seed=5)).status_code == 302
    body = {"config": {"steps": 3, "seed": 5}}
    response = client.post("/api/v1/runs", body, content_type="application/json", headers=bearer(launcher))
    assert response.status_code == 201
    page_run, api_run = Run.objects.order_by("id")
    assert page_run.config == api_run.config and page_run.name == api_run.name

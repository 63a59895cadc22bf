"""Words a user expects (issue 50): the clone form says it clones which run, and the top bar links the API."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.api.conftest import grant_launch, make_run
from trainer.config import get_preset
from webapp.models import Run

pytestmark = pytest.mark.django_db


def test_the_clone_form_is_titled_with_the_run_it_clones_escaped_and_links_it(client, user):
    run = make_run(grant_launch(user), name="<b>mine</b>")
    client.force_login(user)
    page = client.get(reverse("run_launch") + f"?clone={run.id}").content.decode()
    assert "<h1>Clone “&lt;b&gt;mine&lt;/b&gt;”</h1>" in page and "<b>mine</b>" not in page
    assert f'href="{reverse("run_detail", args=[run.id])}"' in page
    assert "Launch a run</h1>" not in page


def test_a_new_launch_is_still_titled_launch_a_run(client, user):
    client.force_login(grant_launch(user))
    assert "<h1>Launch a run</h1>" in client.get(reverse("run_launch")).content.decode()


def test_the_top_bar_links_the_api_reference(client, user):
    client.force_login(user)
    page = client.get(reverse("home")).content.decode()
    assert f'href="{reverse("api-v1:openapi-view")}">API</a>' in page


def test_a_succeeded_run_offers_no_resume_and_refuses_one(client, user, tmp_path):
    (tmp_path / "state.json").write_text("{}")  # a checkpoint it could be resumed from
    steps = get_preset("cpu").steps
    run = make_run(grant_launch(user), status=Run.Status.SUCCEEDED, step=steps, checkpoint_dir=str(tmp_path))
    client.force_login(user)
    page = client.get(reverse("run_detail", args=[run.id])).content.decode()
    assert "Resume from checkpoint</button>" not in page and "Clone this run</a>" in page
    refused = client.post(reverse("run_resume", args=[run.id]), follow=True).content.decode()
    assert "this run finished all its steps; clone it (with more steps) to train further" in refused
    assert Run.objects.count() == 1

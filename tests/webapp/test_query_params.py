"""Malformed or out-of-range whole numbers in a page's request are refused with a 400 that says which
parameter and what it takes: never a server error, never a silent default."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.http import QueryDict
from django.urls import reverse

from webapp.forms import INT_MAX, BadParameter, int_param
from webapp.models import EpisodeRecord, Run

pytestmark = pytest.mark.django_db

HUGE = "99999999999999999999"


@pytest.fixture
def run(user):
    user.user_permissions.add(
        Permission.objects.get(codename="edit_bank"),
        Permission.objects.get(codename="launch_run", content_type__app_label="webapp"),
    )
    run = Run.objects.create(name="r", owner=user)
    EpisodeRecord.objects.create(run=run, step=4, task_instance=0, env="e", seed=0, guided=False, reward=1.0,
                                 success=True, num_actions=1)  # fmt: skip
    return run


def test_int_param_takes_whole_numbers_in_range_and_refuses_the_rest_by_name():
    query = QueryDict("step=7&empty=&bad=--1&big=" + HUGE + "&neg=-3")
    assert int_param(query, "step") == 7
    assert int_param(query, "empty", default=2) == 2 and int_param(query, "absent") is None
    for name in ("bad", "big", "neg"):
        with pytest.raises(BadParameter, match=f"^{name} must be a whole number from 0 to {INT_MAX}"):
            int_param(query, name)


@pytest.mark.parametrize("step", ["--1", HUGE, "-" + HUGE, "-5", "1e3", "x"])
def test_a_bad_step_on_the_episodes_page_is_a_400_naming_the_parameter(client, user, run, step):
    client.force_login(user)
    response = client.get(reverse("run_inspect", args=[run.id]), {"step": step})
    page = response.content.decode()
    assert response.status_code == 400 and "step must be a whole number from 0 to" in page


@pytest.mark.parametrize("episode", ["--1", HUGE, "0"])
def test_a_bad_episode_to_highlight_is_a_400(client, user, run, episode):
    client.force_login(user)
    response = client.get(reverse("run_inspect", args=[run.id]), {"episode": episode})
    assert response.status_code == 400 and "episode must be a whole number" in response.content.decode()


def test_the_episodes_page_still_shows_a_good_step_and_highlights_an_episode(client, user, run):
    client.force_login(user)
    episode = EpisodeRecord.objects.get(run=run)
    page = client.get(reverse("run_inspect", args=[run.id]), {"step": "4", "episode": episode.id})
    assert page.status_code == 200 and 'class="episode won highlight"' in page.content.decode()
    assert client.get(reverse("run_inspect", args=[run.id]), {"step": ""}).status_code == 200


@pytest.mark.parametrize("clone", ["--1", HUGE + HUGE, "0"])
def test_a_bad_clone_id_is_a_400(client, user, run, clone):
    client.force_login(user)
    response = client.get(reverse("run_launch"), {"clone": clone})
    assert response.status_code == 400 and "clone must be a whole number" in response.content.decode()


@pytest.mark.parametrize(
    "query",
    [
        {"never_retrieved": "on", "min_guided": HUGE, "success_rate_below": "0.5"},
        {"older_than_step": HUGE},
    ],
)
def test_a_prune_rule_beyond_any_step_or_count_is_refused_next_to_its_field(client, user, run, query):
    client.force_login(user)
    response = client.get(reverse("bank_prune", args=[run.id]), query)
    assert response.status_code == 400 and "less than or equal to 2147483647" in response.content.decode()


def test_a_prune_confirmation_with_an_impossible_id_is_refused_with_a_message(client, user, run):
    client.force_login(user)
    data = {"never_retrieved": "on", "confirm": "1", "ids": f"1,{HUGE}"}
    response = client.post(reverse("bank_prune", args=[run.id]), data)
    assert response.status_code == 400 and "preview the prune again" in response.content.decode()


@pytest.mark.parametrize("view", ["compare", "compare_csv"])
def test_an_impossible_run_id_to_compare_is_refused_with_a_message(client, user, run, view):
    client.force_login(user)
    response = client.get(reverse(view), {"runs": [run.id, HUGE]}, follow=True)
    assert "run ids are whole numbers from 1 to" in response.content.decode()


@pytest.mark.parametrize("version", ["--1", HUGE])
def test_a_bad_version_on_pin_or_delete_is_a_400(client, user, run, version):
    from experience.services import experience_add

    entry = experience_add(run, "s", "t", "c")
    client.force_login(user)
    for view in ("bank_pin", "bank_delete"):
        response = client.post(reverse(view, args=[run.id, entry.id]), {"pinned": "1", "version": version})
        assert response.status_code == 400 and "version must be a whole number" in response.content.decode()
    entry.refresh_from_db()
    assert not entry.pinned and not entry.is_deleted


def test_a_refused_action_and_a_missing_page_say_why_in_words(client, user, other_user, run):
    client.force_login(other_user)
    assert "belongs to another user" in client.get(reverse("run_inspect", args=[run.id])).content.decode()
    Run.objects.filter(pk=run.pk).update(shared=True)
    response = client.post(reverse("run_cancel", args=[run.id]))
    assert (
        response.status_code == 403 and "only the run&#x27;s owner may do this." in response.content.decode()
    )

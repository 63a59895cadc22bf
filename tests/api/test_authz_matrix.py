"""Who may do what through the API, endpoint by endpoint, and the same outcome on the page that does the same
thing: anonymous, a user without the launch permission, the owner, another user (on a private and on a shared
run), and staff (without the launch permission)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from tests.api.conftest import bearer, grant_launch, make_run
from tests.api.test_validation_parity import _form_data
from webapp.models import Run

pytestmark = pytest.mark.django_db

OK, LOGIN, FORBIDDEN, HIDDEN = "ok", "login", "forbidden", "hidden"


@dataclass
class Targets:
    queued: Run
    """A run to read and cancel."""
    finished: Run
    """A failed run with a checkpoint, to resume."""


@dataclass(frozen=True)
class Endpoint:
    method: str
    api: str
    """The API path, with {queued} / {finished} for the targets' ids."""
    page: str | None
    """The page doing the same, if any (same placeholders)."""
    expected: dict[str, str]


READ = {"anonymous": LOGIN, "no-permission": HIDDEN, "owner": OK, "other": HIDDEN, "other-shared": OK,
        "staff": OK}  # fmt: skip
ENDPOINTS = [
    Endpoint("get", "/api/v1/", None, READ | {"no-permission": OK, "other": OK}),
    Endpoint("get", "/api/v1/runs", "/", READ | {"no-permission": OK, "other": OK}),
    Endpoint("get", "/api/v1/runs/{queued}", "/runs/{queued}/", READ),
    Endpoint("get", "/api/v1/runs/{queued}/metrics", "/runs/{queued}/", READ),
    Endpoint("get", "/api/v1/runs/{queued}/metrics/rows", "/runs/{queued}/", READ),
    Endpoint("get", "/api/v1/runs/{queued}/episodes", "/runs/{queued}/episodes/", READ),
    Endpoint("get", "/api/v1/runs/{queued}/bank", "/runs/{queued}/bank/", READ),
    Endpoint("get", "/api/v1/runs/{queued}/imports", "/runs/{queued}/bank/", READ),
    Endpoint(
        "post",
        "/api/v1/runs",
        "/runs/launch/",
        {
            "anonymous": LOGIN,
            "no-permission": FORBIDDEN,
            "owner": OK,
            "other": OK,
            "other-shared": OK,
            "staff": FORBIDDEN,
        },
    ),  # fmt: skip
    Endpoint(
        "post",
        "/api/v1/runs/{queued}/clone",
        "/runs/launch/?clone={queued}",
        {
            "anonymous": LOGIN,
            "no-permission": FORBIDDEN,
            "owner": OK,
            "other": HIDDEN,
            "other-shared": OK,
            "staff": FORBIDDEN,
        },
    ),  # fmt: skip
    Endpoint(
        "post",
        "/api/v1/runs/{finished}/resume",
        "/runs/{finished}/resume/",
        {
            "anonymous": LOGIN,
            "no-permission": HIDDEN,
            "owner": OK,
            "other": HIDDEN,
            "other-shared": FORBIDDEN,
            "staff": FORBIDDEN,
        },
    ),  # fmt: skip
    Endpoint(
        "post",
        "/api/v1/runs/{queued}/cancel",
        "/runs/{queued}/cancel/",
        {
            "anonymous": LOGIN,
            "no-permission": HIDDEN,
            "owner": OK,
            "other": HIDDEN,
            "other-shared": FORBIDDEN,
            "staff": OK,
        },
    ),  # fmt: skip
]


def _targets(owner, shared: bool, checkpoint: str) -> Targets:
    return Targets(
        queued=make_run(owner, shared=shared),
        finished=make_run(owner, shared=shared, status=Run.Status.FAILED, checkpoint_dir=checkpoint),
    )


def _caller(role: str, owner):
    users = get_user_model().objects
    if role == "anonymous":
        return None
    if role == "owner":
        return owner
    if role == "no-permission":
        return users.create_user("dave")
    if role == "staff":
        return users.create_user("erin", is_staff=True)
    return grant_launch(users.create_user("frank"))


def _api_outcome(response) -> str:
    status = response.status_code
    assert status in (200, 201, 401, 403, 404), (status, response.content)
    return {401: LOGIN, 403: FORBIDDEN, 404: HIDDEN}.get(status, OK)


def _page_outcome(response) -> str:
    status = response.status_code
    if status == 302:
        return LOGIN if response["Location"].startswith(reverse("login")) else OK
    assert status in (200, 403, 404), status
    return {403: FORBIDDEN, 404: HIDDEN}.get(status, OK)


@pytest.mark.parametrize("role", list(READ))
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.api}")
def test_the_api_allows_exactly_what_the_pages_allow(endpoint, role, django_user_model, checkpoint):
    owner = grant_launch(django_user_model.objects.create_user("owner"))
    who = _caller(role, owner)
    shared = role == "other-shared"
    api_targets, page_targets = _targets(owner, shared, checkpoint), _targets(owner, shared, checkpoint)

    api = Client()
    headers = bearer(who) if who else {}
    url = endpoint.api.format(queued=api_targets.queued.id, finished=api_targets.finished.id)
    if endpoint.method == "get":
        response = api.get(url, headers=headers)
    else:
        body = {"config": {"steps": 3}}
        response = api.post(url, body, content_type="application/json", headers=headers)
    assert _api_outcome(response) == endpoint.expected[role], response.content

    if endpoint.page is None:
        return
    page = Client()
    if who:
        page.force_login(who)
    url = endpoint.page.format(queued=page_targets.queued.id, finished=page_targets.finished.id)
    if endpoint.method == "get" or "clone=" in url:
        response = page.get(url)
    else:
        response = page.post(url, _form_data(steps=3) if url.endswith("launch/") else {})
    assert _page_outcome(response) == endpoint.expected[role]

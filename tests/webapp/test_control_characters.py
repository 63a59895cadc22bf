"""A query parameter holding a control character is refused at the door, naming it: 422 on the API, 400 on a
page, never a 500 from PostgreSQL (which cannot hold a NUL); an anonymous API call is 401 whatever it sends,
and whatever its method (not the CSRF check's 403)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tests.api.conftest import bearer, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(user):
    return make_run(user)


@pytest.mark.parametrize("value", ["%00", "a%01b", "%1f", "%7f"])
def test_an_api_parameter_with_a_control_character_is_refused_with_422_naming_it(client, user, run, value):
    response = client.get(f"/api/v1/runs/{run.id}/bank?scope={value}", **_headers(user))
    assert response.status_code == 422, response.content
    assert response.json()["errors"] == {"scope": ["contains a control character"]}


def test_a_control_character_in_a_parameter_name_is_refused_and_shown_escaped(client, user, run):
    response = client.get(f"/api/v1/runs/{run.id}/bank?sc%00ope=x", **_headers(user))
    assert response.status_code == 422
    assert response.json()["errors"] == {"sc\\x00ope": ["contains a control character"]}


def test_tab_line_feed_and_ordinary_text_pass(client, user, run):
    response = client.get(f"/api/v1/runs/{run.id}/bank?scope=a%09b%0Ac", **_headers(user))
    assert response.status_code == 200


def test_a_page_parameter_with_a_control_character_is_a_400(client, user, run):
    client.force_login(user)
    assert client.get(reverse("home") + "?q=%00").status_code == 400
    assert client.get(reverse("home") + "?q=ok").status_code == 200


def test_an_anonymous_api_call_is_401_even_with_a_control_character(client, run):
    assert client.get(f"/api/v1/runs/{run.id}/bank?scope=%00").status_code == 401


UNSAFE = ["runs", "plan", "runs/{id}/clone", "runs/{id}/resume", "runs/{id}/cancel"]


@pytest.mark.parametrize("operation", UNSAFE)
def test_an_anonymous_unsafe_api_call_is_401_not_a_csrf_403(run, operation):
    url = "/api/v1/" + operation.format(id=run.id)
    response = Client(enforce_csrf_checks=True).post(url, "{}", "application/json")
    assert response.status_code == 401, response.content


def test_a_signed_in_browser_without_the_csrf_token_still_gets_the_csrf_403(user):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.post("/api/v1/runs", "{}", "application/json").status_code == 403


def _headers(user) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": bearer(user)["Authorization"]}

"""Browser sessions (with CSRF on writes) and the per-user rate limit (counted in Redis, 429 beyond it)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.api.conftest import bearer, make_run
from webapp.models import Run

pytestmark = pytest.mark.django_db


def test_a_session_reads_and_writes_only_with_the_csrf_token(user):
    run = make_run(user)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get("/api/v1/runs").json()["count"] == 1
    response = browser.post(f"/api/v1/runs/{run.id}/cancel")
    assert response.status_code == 403 and Run.objects.get().status == Run.Status.QUEUED
    browser.get("/account/")  # sets the CSRF cookie, as any page does
    csrf = browser.cookies["csrftoken"].value
    response = browser.post(f"/api/v1/runs/{run.id}/cancel", headers={"X-CSRFToken": csrf})
    assert response.status_code == 200 and Run.objects.get().status == Run.Status.CANCELLED


def test_a_bad_token_is_refused_even_beside_a_valid_session(client, user):
    client.force_login(user)
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer crs_nope"}).status_code == 401
    assert client.get("/api/v1/runs").status_code == 200


def test_each_user_gets_the_configured_rate_then_429(client, settings, user, other_user):
    settings.STUDIO_API_RATE = "3/min"
    token = bearer(user, "read")
    client.force_login(user)
    assert [client.get("/api/v1/runs").status_code for _ in range(2)] == [200, 200]
    assert client.get("/api/v1/runs", headers=token).status_code == 200  # session and tokens count together
    limited = client.get("/api/v1/runs", headers=token)
    assert limited.status_code == 429 and int(limited["Retry-After"]) > 0
    assert limited.json() == {"detail": "Too many requests."}
    assert Client().get("/api/v1/runs", headers=bearer(other_user, "read")).status_code == 200


def test_a_form_encoded_write_is_refused_with_a_clear_message_not_a_500(launcher):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(launcher)
    browser.get("/account/")
    csrf = browser.cookies["csrftoken"].value
    response = browser.post("/api/v1/runs", {"name": "x"}, headers={"X-CSRFToken": csrf})
    assert response.status_code == 415 and "JSON" in response.json()["detail"]
    assert not Run.objects.exists()

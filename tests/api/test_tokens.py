"""Personal access tokens: made and revoked on the account page, shown once, stored hashed, scoped."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from api.models import AccessToken
from api.tokens import token_create
from tests.api.conftest import bearer, make_run
from webapp.models import Run

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs"


def test_a_new_token_is_shown_once_and_only_its_hash_is_stored(client, user):
    client.force_login(user)
    response = client.post(reverse("token_new"), {"name": "laptop", "scope": "read", "expires_in_days": "30"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    (secret,) = re.findall(r'id="token-secret">(crs_[\w-]+)<', response.content.decode())
    token = AccessToken.objects.get()
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(list(AccessToken.objects.values_list()))  # no column holds the secret itself
    assert token.hint == secret[:12] and token.scope == "read" and token.user == user
    assert token.expires_at - timezone.now() > timedelta(days=29)
    page = client.get(reverse("account")).content.decode()
    assert "laptop" in page and token.hint in page and secret not in page
    client.logout()
    assert client.get(RUNS, headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_revoked_token_stops_working_and_only_its_owner_can_revoke_it(client, user, other_user):
    token, secret = token_create(user, "nightly-sync", "read")
    auth = {"Authorization": f"Bearer {secret}"}
    assert client.get(RUNS, headers=auth).status_code == 200
    client.force_login(other_user)
    assert client.post(reverse("token_revoke", args=[token.id])).status_code == 404
    assert client.get(RUNS, headers=auth).status_code == 200
    client.force_login(user)
    assert client.post(reverse("token_revoke", args=[token.id])).status_code == 302
    page = client.get(reverse("account")).content.decode()
    assert "Revoked the token" in page and f'id="token-{token.id}"' not in page
    client.logout()
    response = client.get(RUNS, headers=auth)
    assert response.status_code == 401 and response.json() == {"detail": "Unauthorized"}


def test_a_read_token_can_read_but_not_launch_clone_resume_or_cancel(client, launcher, checkpoint):
    run = make_run(launcher)
    done = make_run(launcher, status=Run.Status.FAILED, checkpoint_dir=checkpoint)
    read = bearer(launcher, "read")
    assert client.get(f"{RUNS}/{run.id}", headers=read).status_code == 200
    writes = [RUNS, f"{RUNS}/{run.id}/clone", f"{RUNS}/{done.id}/resume", f"{RUNS}/{run.id}/cancel"]
    for url in writes:
        response = client.post(url, {}, content_type="application/json", headers=read)
        assert response.status_code == 403, url
        assert "may only read" in response.json()["detail"]
    assert Run.objects.count() == 2 and Run.objects.get(pk=run.pk).status == Run.Status.QUEUED
    write = bearer(launcher, "read-write")
    assert client.post(f"{RUNS}/{run.id}/cancel", headers=write).json()["status"] == "cancelled"


def test_expired_tokens_inactive_users_and_malformed_headers_are_refused(client, user):
    _, expired = token_create(user, "old", "read", expires_in_days=1)
    AccessToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.get(RUNS, headers={"Authorization": f"Bearer {expired}"}).status_code == 401
    _, secret = token_create(user, "new", "read")
    for header in [f"Token {secret}", "Bearer", f"Bearer {secret}x", f"Bearer {secret[4:]}", "Bearer crs_"]:
        assert client.get(RUNS, headers={"Authorization": header}).status_code == 401, header
    user.is_active = False
    user.save()
    assert client.get(RUNS, headers={"Authorization": f"Bearer {secret}"}).status_code == 401


def test_the_account_page_lists_only_the_users_own_tokens_and_needs_login(client, user, other_user):
    token_create(other_user, "bob's secret script", "read-write")
    assert client.get(reverse("account")).status_code == 302
    client.force_login(user)
    page = client.get(reverse("account")).content.decode()
    assert "bob's secret script" not in page and "No tokens." in page
    response = client.post(reverse("token_new"), {"name": "", "scope": "admin"})
    assert response.status_code == 400 and not AccessToken.objects.filter(user=user).exists()

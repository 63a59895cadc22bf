"""In a real browser: a user makes a token on the account page, sees it once, and reads the API's docs, whose
scripts run under the site's Content-Security-Policy. Screenshots in test-artifacts/api-*.png."""

from __future__ import annotations

import hashlib
import json
import urllib.request

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from api.models import AccessToken
from tests.e2e.conftest import ARTIFACTS, browser_page, server, training_queue  # noqa: F401 (fixtures)

PASSWORD = "correct horse battery"


def test_a_user_makes_a_token_and_reads_the_api_docs(server, browser_page, django_user_model):  # noqa: F811
    hasher = PBKDF2PasswordHasher()  # the server keeps the default hashers
    django_user_model.objects.create(username="alice", password=hasher.encode(PASSWORD, hasher.salt()))
    page = browser_page
    blocked = []
    page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)

    page.goto(server + "/account/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.click("nav >> text=Account")
    page.fill("#id_name", "notebook")
    page.select_option("#id_scope", "read")
    page.click("#token-form button[type=submit]")
    secret = page.inner_text("#token-secret")
    assert AccessToken.objects.get().digest == hashlib.sha256(secret.encode()).hexdigest()
    page.screenshot(path=str(ARTIFACTS / "api-01-token-shown-once.png"), full_page=True)
    page.goto(server + "/account/")
    assert secret not in page.content() and "notebook" in page.inner_text("#tokens")

    page.goto(server + "/api/v1/docs")
    page.wait_for_selector(".opblock-summary-path[data-path='/api/v1/runs/{run_id}/cancel']")
    assert "Complementary RL Studio API" in page.inner_text(".swagger-ui .info")
    page.screenshot(path=str(ARTIFACTS / "api-02-docs.png"), full_page=True)
    assert blocked == []

    request = urllib.request.Request(server + "/api/v1/runs", headers={"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response) == {"items": [], "count": 0}


pytestmark = pytest.mark.django_db(transaction=True)

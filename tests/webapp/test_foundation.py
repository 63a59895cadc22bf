"""The foundation against the real embedded services: pgvector + HNSW, Celery, Channels, login."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from pgvector.django import CosineDistance

from experience.models import Experience
from webapp.asgi import application
from webapp.models import Run
from webapp.tasks import broadcast_run_event_task, ping

REPO = Path(__file__).resolve().parents[2]


def _unit(v: np.ndarray) -> list[float]:
    return (v / np.linalg.norm(v)).tolist()


@pytest.mark.django_db
def test_a_nearest_neighbour_query_uses_the_hnsw_index_and_finds_the_right_entry():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(200, 384))
    Experience.objects.bulk_create(
        Experience(title=f"entry {i}", content="...", embedding=_unit(v)) for i, v in enumerate(vectors)
    )
    query = _unit(vectors[137] + 0.05 * rng.normal(size=384))
    nearest = Experience.objects.order_by(CosineDistance("embedding", query))[:1]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a 200-row table would be scanned otherwise
        plan = nearest.explain()
        found = list(nearest)
    assert "experience_embedding_hnsw" in plan
    assert found[0].title == "entry 137"


@pytest.mark.django_db(transaction=True)
def test_a_task_sent_to_a_real_worker_runs_and_its_stored_result_reads_back(celery_worker):
    result = ping.apply_async(args=["hello"], queue=celery_worker)
    value = result.get(timeout=30)
    assert value["payload"] == "hello"
    from django_celery_results.models import TaskResult

    stored = TaskResult.objects.get(task_id=result.id)
    assert stored.status == "SUCCESS" and '"hello"' in stored.result


async def _connect(run_id: int, cookie: str | None) -> tuple[WebsocketCommunicator, bool]:
    headers = [(b"origin", b"http://127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_anonymous_websocket_is_refused(user):
    run = await Run.objects.acreate(name="r", owner=user)
    communicator, connected = await _connect(run.id, cookie=None)
    assert not connected
    await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_websocket_to_someone_elses_private_run_is_refused(async_client, user, other_user):
    run = await Run.objects.acreate(name="r", owner=other_user)
    await async_client.aforce_login(user)
    communicator, connected = await _connect(run.id, async_client.cookies["sessionid"].value)
    assert not connected
    await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_group_message_from_a_celery_worker_reaches_a_logged_in_socket(
    async_client, user, celery_worker
):
    run = await Run.objects.acreate(name="r", owner=user)
    await async_client.aforce_login(user)
    communicator, connected = await _connect(run.id, async_client.cookies["sessionid"].value)
    assert connected
    broadcast_run_event_task.apply_async(args=[run.id, {"kind": "step", "step": 3}], queue=celery_worker)
    message = await communicator.receive_json_from(timeout=20)
    assert message == {"kind": "step", "step": 3}
    await communicator.disconnect()


def _named_routes(resolver: URLResolver, prefix: str = "") -> list[str]:
    names = []
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            if pattern.namespace != "admin":
                namespace = pattern.namespace + ":" if pattern.namespace else ""
                names += _named_routes(pattern, prefix + namespace)
        elif isinstance(pattern, URLPattern) and pattern.name and not pattern.pattern.converters:
            names.append(prefix + pattern.name)
    return names


@pytest.mark.django_db
def test_every_page_requires_login(client):
    public = {"login"}
    routes = [name for name in _named_routes(get_resolver()) if name not in public]
    assert "home" in routes
    assert any(name.startswith("api-v1:") for name in routes)
    for name in routes:
        response = client.get(reverse(name))
        if name.startswith("api-v1:") or name == "metrics":  # for scripts (and scrapers): 401, never a login
            if response.status_code == 405:  # a POST-only endpoint (the plan): asked the way it is used
                response = client.post(reverse(name), "{}", content_type="application/json")
            assert response.status_code == 401, name
            continue
        assert response.status_code == 302, name
        assert response["Location"].startswith(reverse("login")), name
    admin = client.get(reverse("admin:index"))
    assert admin.status_code == 302 and "login" in admin["Location"]


@pytest.mark.django_db
def test_a_user_sees_their_runs_and_shared_ones_but_not_others_private_runs(client, user, other_user):
    Run.objects.create(name="mine", owner=user)
    Run.objects.create(name="theirs-private", owner=other_user)
    Run.objects.create(name="theirs-shared", owner=other_user, shared=True)
    client.force_login(user)
    page = client.get(reverse("home")).content.decode()
    assert "mine" in page and "theirs-shared" in page and "theirs-private" not in page


@pytest.mark.django_db
def test_login_page_is_served_and_a_login_reaches_the_dashboard(client, user):
    assert client.get(reverse("login")).status_code == 200
    response = client.post(reverse("login"), {"username": "alice", "password": "correct horse battery"})
    assert response.status_code == 302 and response["Location"] == reverse("home")
    assert "Runs" in client.get(reverse("home")).content.decode()


@pytest.mark.django_db
def test_user_text_is_escaped_on_the_dashboard(client, user):
    Run.objects.create(name="<script>alert(1)</script>", owner=user)
    client.force_login(user)
    page = client.get(reverse("home")).content.decode()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


@pytest.mark.django_db
def test_a_post_without_csrf_token_is_rejected(user):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post(reverse("logout")).status_code == 403


@pytest.mark.django_db
def test_repeated_wrong_passwords_lock_the_account_for_that_address_even_with_the_right_one(
    client, user, settings
):
    settings.AXES_FAILURE_LIMIT = 5
    codes = [
        client.post(reverse("login"), {"username": "alice", "password": "wrong"}).status_code
        for _ in range(5)
    ]
    assert codes == [200, 200, 200, 200, 429]  # the form with its error, then locked at the limit
    locked = client.post(reverse("login"), {"username": "alice", "password": "correct horse battery"})
    assert locked.status_code == 429 and "Too many failed logins" in locked.content.decode()
    assert client.get(reverse("home")).status_code == 302  # not logged in


@pytest.mark.django_db
def test_pages_carry_a_content_security_policy_without_inline_scripts(client, user):
    client.force_login(user)
    run = Run.objects.create(name="r", owner=user)
    for url in (reverse("home"), reverse("run_detail", args=[run.id]), reverse("login")):
        response = client.get(url)
        policy = response["Content-Security-Policy"]
        assert (
            "script-src 'self'" in policy
            and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
        )
        body = response.content.decode()
        assert "<script>" not in body and " onchange=" not in body and " onclick=" not in body, url


def test_the_deploy_check_is_clean_in_https_mode():
    env = {**os.environ, "HTTPS": "true", "DEBUG": "false", "SECRET_KEY": "x" * 60 + "-deploy-check-key-1234"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr

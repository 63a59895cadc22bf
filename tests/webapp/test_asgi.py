"""The product's ASGI application as its web server serves it: a request's middleware and view run in one
thread, entered once; a web-server process moves what it loaded out of the garbage collector's sight."""

from __future__ import annotations

import gc

import pytest
from asgiref.sync import SyncToAsync
from channels.testing import ApplicationCommunicator

from api.tokens import token_create
from experience.models import Experience
from webapp import asgi
from webapp.asgi import application
from webapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def thread_hops(monkeypatch) -> list:
    """Every ``sync_to_async`` call from here on (what it ran)."""
    calls = []
    original = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        calls.append(self.func)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    return calls


async def _get(path: str, *headers: tuple[bytes, bytes]) -> dict:
    """A GET as uvicorn hands it over: ``{"status", "body"}`` (a streamed body's parts joined)."""
    scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": path, "query_string": b"",
             "headers": [(b"host", b"127.0.0.1"), *headers]}  # fmt: skip
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=20)
    body = b""
    while True:
        part = await communicator.receive_output(timeout=20)
        body += part.get("body", b"")
        if not part.get("more_body"):
            return {"status": start["status"], "body": body}


@pytest.mark.asyncio
async def test_a_page_runs_its_middleware_and_view_in_one_thread_once(async_client, user, thread_hops):
    await async_client.aforce_login(user)
    cookie = f"sessionid={async_client.cookies['sessionid'].value}".encode()
    thread_hops.clear()
    response = await _get("/", (b"cookie", cookie))
    assert response["status"] == 200 and b"Runs" in response["body"]
    # the request_started signal; the whole stack and the view; closing the response (Django's own ASGI
    # handler: 21, two for each middleware)
    assert len(thread_hops) <= 3, thread_hops


@pytest.mark.asyncio
async def test_an_api_call_with_a_token_too(user, thread_hops):
    _, secret = await SyncToAsync(token_create)(user, name="t", scope="read")
    run = await Run.objects.acreate(name="mine", owner=user)
    thread_hops.clear()
    response = await _get(f"/api/v1/runs/{run.id}", (b"authorization", f"Bearer {secret}".encode()))
    assert response["status"] == 200 and b'"mine"' in response["body"]
    assert len(thread_hops) <= 3, thread_hops


@pytest.mark.asyncio
async def test_a_streamed_export_and_a_refusal_still_reach_the_client(async_client, user, other_user):
    run = await Run.objects.acreate(name="r", owner=user)
    vector = [0.0] * 383 + [1.0]
    await Experience.objects.acreate(run=run, title="stairs", content="go down", embedding=vector)
    await async_client.aforce_login(user)
    cookie = (b"cookie", f"sessionid={async_client.cookies['sessionid'].value}".encode())
    export = await _get(f"/runs/{run.id}/bank/export/", cookie)
    assert export["status"] == 200 and b"stairs" in export["body"]
    await async_client.aforce_login(other_user)
    cookie = (b"cookie", f"sessionid={async_client.cookies['sessionid'].value}".encode())
    assert (await _get(f"/runs/{run.id}/bank/export/", cookie))["status"] == 404


def test_a_web_server_process_settles_what_it_loaded_out_of_the_collectors_sight(settings):
    settings.STUDIO_WARM_START = False  # no model to wait for: it settles at once
    try:
        assert asgi.served() is application
        assert gc.get_freeze_count() > 10_000  # Django, the project, the test session
    finally:
        gc.unfreeze()

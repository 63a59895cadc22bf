"""The run socket through Channels' communicator: catch-up from stored rows, live relay, refusals."""

from __future__ import annotations

import time

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connections

from webapp.asgi import application
from webapp.events import broadcast_run_event
from webapp.models import MetricRow, Run

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest_asyncio.fixture(autouse=True)
async def _connections_back_to_the_pool():
    """A test's ORM calls and its consumers' run in the event loop's thread-sensitive thread, which no
    request cycle ends: hand that thread's connections back, or each test keeps one out of the test
    process's bounded pool until later tests wait in vain (``webapp.dbpool``)."""
    yield
    await sync_to_async(connections.close_all)()


async def _connect(path: str, cookie: str | None) -> tuple[WebsocketCommunicator, bool]:
    headers = [(b"origin", b"http://127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


async def _login(async_client, user) -> str:
    await async_client.aforce_login(user)
    return async_client.cookies["sessionid"].value


async def test_a_late_subscriber_first_gets_the_rows_after_its_cursor_then_live_events(async_client, user):
    run = await Run.objects.acreate(name="r", owner=user)
    rows = [
        await MetricRow.objects.acreate(run=run, step=s, wall_time=s, values={"success": s / 10})
        for s in range(4)
    ]
    await MetricRow.objects.acreate(run=run, step=3, kind="eval", wall_time=4, values={"success_with": 0.5})
    communicator, connected = await _connect(
        f"/ws/runs/{run.id}/?since={rows[1].id}", await _login(async_client, user)
    )
    assert connected
    caught_up = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
    assert [(e["metric_kind"], e["step"]) for e in caught_up] == [("train", 2), ("train", 3), ("eval", 3)]
    assert caught_up[0] == {"kind": "metrics", "id": rows[2].id, "metric_kind": "train", "step": 2,
                            "wall_time": 2.0, "values": {"success": 0.2}}  # fmt: skip
    await sync_to_async(broadcast_run_event)(
        run.id, {"kind": "metrics", "step": 4, "values": {"success": 1.0}}
    )
    assert (await communicator.receive_json_from(timeout=5))["step"] == 4
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


async def test_without_a_cursor_only_live_events_arrive(async_client, user):
    run = await Run.objects.acreate(name="r", owner=user)
    await MetricRow.objects.acreate(run=run, step=0, wall_time=0, values={"success": 0})
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", await _login(async_client, user))
    assert connected and await communicator.receive_nothing(timeout=0.3)
    await sync_to_async(broadcast_run_event)(run.id, {"kind": "status", "status": "cancelled"})
    assert await communicator.receive_json_from(timeout=5) == {"kind": "status", "status": "cancelled"}
    await communicator.disconnect()


async def test_a_socket_idle_past_redis_blocking_read_on_a_busy_server_stays_open(async_client, user):
    """The layer's blocking read ends after ``brpop_timeout`` s on the server; a web server busy beyond that
    (here: its event loop blocked) must still take the empty reply and wait on, not drop the socket."""
    run = await Run.objects.acreate(name="r", owner=user)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", await _login(async_client, user))
    assert connected and await communicator.receive_nothing(timeout=0.3)
    time.sleep(get_channel_layer().brpop_timeout + 1.5)  # noqa: ASYNC251 - the busy event loop is the point
    await sync_to_async(broadcast_run_event)(run.id, {"kind": "status", "status": "running"})
    assert await communicator.receive_json_from(timeout=5) == {"kind": "status", "status": "running"}
    await communicator.disconnect()


async def test_a_shared_run_streams_to_other_users_but_a_private_one_does_not(async_client, user, other_user):
    shared = await Run.objects.acreate(name="s", owner=other_user, shared=True)
    private = await Run.objects.acreate(name="p", owner=other_user)
    cookie = await _login(async_client, user)
    communicator, connected = await _connect(f"/ws/runs/{shared.id}/?since=0", cookie)
    assert connected
    await communicator.disconnect()
    communicator, connected = await _connect(f"/ws/runs/{private.id}/?since=0", cookie)
    assert not connected
    await communicator.disconnect()


async def test_anonymous_sockets_are_refused(user):
    run = await Run.objects.acreate(name="r", owner=user)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/?since=0", None)
    assert not connected
    await communicator.disconnect()


async def test_a_run_made_private_stops_streaming_to_a_subscriber_who_may_no_longer_see_it(
    async_client, user, other_user
):
    run = await Run.objects.acreate(name="s", owner=other_user, shared=True)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", await _login(async_client, user))
    assert connected
    await sync_to_async(broadcast_run_event)(run.id, {"kind": "status", "status": "running"})
    assert (await communicator.receive_json_from(timeout=5))["status"] == "running"
    run.shared = False
    await run.asave(update_fields=["shared"])  # as the admin does: the socket checks at once
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"
    await sync_to_async(broadcast_run_event)(run.id, {"kind": "metrics", "step": 9, "values": {"secret": 1}})
    assert await _no_data(communicator)


async def test_a_change_behind_the_orms_back_stops_the_stream_at_the_next_periodic_check(
    async_client, user, other_user, settings
):
    settings.SOCKET_ACCESS_RECHECK_S = 1.0
    run = await Run.objects.acreate(name="s", owner=other_user, shared=True)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", await _login(async_client, user))
    assert connected
    await Run.objects.filter(pk=run.pk).aupdate(shared=False)  # no signal: nothing tells the socket
    assert await communicator.receive_nothing(timeout=1.1)  # ... until its periodic check
    await sync_to_async(broadcast_run_event)(run.id, {"kind": "metrics", "step": 2, "values": {"secret": 1}})
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"


async def test_a_user_who_loses_their_rights_is_cut_off_at_once(async_client, user, other_user):
    run = await Run.objects.acreate(name="s", owner=other_user, shared=True)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", await _login(async_client, user))
    assert connected
    user.last_login = None
    await user.asave(update_fields=["last_login"])  # not about access: the socket stays
    assert await communicator.receive_nothing(timeout=1)
    user.is_active = False
    await user.asave()
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"


async def test_a_password_change_ends_the_streams_of_the_users_other_sessions(async_client, user):
    run = await Run.objects.acreate(name="r", owner=user)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", await _login(async_client, user))
    assert connected
    user.set_password("a new and different password")
    await user.asave()  # as the password change form or the admin: that session is no longer logged in
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"


async def test_logging_out_closes_the_sockets_of_that_session(async_client, user):
    run = await Run.objects.acreate(name="r", owner=user)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", await _login(async_client, user))
    assert connected
    response = await async_client.post("/logout/")
    assert response.status_code == 302
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"
    await sync_to_async(broadcast_run_event)(run.id, {"kind": "metrics", "step": 1, "values": {"x": 1}})
    assert await _no_data(communicator)


async def _no_data(communicator: WebsocketCommunicator) -> bool:
    """Nothing but (repeated) close frames arrives within half a second."""
    try:
        while True:
            if (await communicator.receive_output(timeout=0.5))["type"] != "websocket.close":
                return False
    except TimeoutError:
        return True


async def test_an_ended_session_gets_no_event_even_without_the_logout_signal(async_client, user, settings):
    settings.SOCKET_ACCESS_RECHECK_S = 0.0  # checked before every event
    run = await Run.objects.acreate(name="r", owner=user)
    cookie = await _login(async_client, user)
    communicator, connected = await _connect(f"/ws/runs/{run.id}/", cookie)
    assert connected
    from django.contrib.sessions.models import Session

    await Session.objects.filter(session_key=cookie).adelete()  # expired, or flushed by another server
    await sync_to_async(broadcast_run_event)(run.id, {"kind": "metrics", "step": 1, "values": {"x": 1}})
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"


async def test_a_socket_to_an_unknown_path_is_refused_not_an_error(async_client, user):
    communicator, connected = await _connect("/ws/runs/abc/", await _login(async_client, user))
    assert not connected
    await communicator.disconnect()

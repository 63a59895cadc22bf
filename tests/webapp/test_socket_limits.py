"""The run socket under load and abuse, through Channels' communicator over the real Redis layer: the
per-user cap (4429), slots freed on close or lapsed after a crash, malformed frames (1003 / 1007), Redis
down (1013)."""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connection

from tests.webapp.conftest import free_port
from webapp import sockets
from webapp.asgi import application
from webapp.consumers import INVALID_PAYLOAD, TOO_MANY_SOCKETS, TRY_AGAIN_LATER, UNSUPPORTED_DATA
from webapp.models import Run

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest_asyncio.fixture(autouse=True)
async def no_slots_left():
    """User ids repeat from test to test: no test inherits the slots of one that failed before it."""
    layer = get_channel_layer()
    conn = layer.connection(0)
    async for key in conn.scan_iter(match=sockets.all_slots_key(layer.prefix) + "*"):
        await conn.delete(key)
    yield
    await sync_to_async(_fresh_db_pool)()


def _fresh_db_pool() -> None:
    """Each test's event loop ends with threads (the sockets' database reads) that never hand their pool
    connections back (about one a test, eight after 200 sockets): the next test starts with a new pool."""
    connection.close_pool()


@pytest_asyncio.fixture
async def run_socket(async_client, user):
    """Makes sockets to one run of ``user``'s, logged in; all disconnected at the end."""
    run = await Run.objects.acreate(name="r", owner=user)
    await async_client.aforce_login(user)
    cookie = async_client.cookies["sessionid"].value
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"cookie", f"sessionid={cookie}".encode())]
    made = []

    def make() -> WebsocketCommunicator:
        made.append(WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=headers))
        return made[-1]

    yield make
    # together: each disconnect waits up to a second for its consumer to end (200 in turn took 160 s)
    await asyncio.gather(*(communicator.disconnect() for communicator in made))


async def _outcome(communicator: WebsocketCommunicator, wait_s: float = 1.0) -> int | str:
    """How a connected socket fares: its close code, or "open" when nothing closes it within ``wait_s``."""
    if await communicator.receive_nothing(timeout=wait_s):  # not receive_output: it cancels on a timeout
        return "open"
    message = await communicator.receive_output(timeout=1)
    assert message["type"] == "websocket.close", message
    return message["code"]


async def _open(make) -> int | str:
    communicator = make()
    connected, code = await communicator.connect(timeout=30)
    return await _outcome(communicator) if connected else code


def _errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def _open_slots() -> int:
    layer = get_channel_layer()
    return await layer.connection(0).zcount(sockets.all_slots_key(layer.prefix), "-inf", "+inf")


async def test_200_sockets_from_one_user_beyond_the_cap_are_closed_with_4429_not_errors(
    run_socket, settings, caplog
):
    settings.STUDIO_SOCKETS_PER_USER = 20
    communicators = [run_socket() for _ in range(200)]
    handshakes = await asyncio.gather(*(c.connect(timeout=60) for c in communicators))  # at once, as a burst
    assert all(connected for connected, _ in handshakes)  # accepted first: a browser sees the close code
    outcomes = await asyncio.gather(*(_outcome(c, wait_s=2) for c in communicators))
    assert outcomes.count("open") == 20
    assert outcomes.count(TOO_MANY_SOCKETS) == 180
    assert await _open_slots() == 20
    assert _errors(caplog) == []


async def test_the_cap_close_frame_tells_the_user_what_to_do(run_socket, settings):
    settings.STUDIO_SOCKETS_PER_USER = 1
    assert await _open(run_socket) == "open"
    refused = run_socket()
    assert (await refused.connect(timeout=30))[0]
    close = await refused.receive_output(timeout=5)
    assert (close["code"], close["reason"]) == (TOO_MANY_SOCKETS, "too many live pages open: close some tabs")


async def test_closing_a_socket_frees_its_slot(run_socket, settings):
    settings.STUDIO_SOCKETS_PER_USER = 2
    first = run_socket()
    assert (await first.connect(timeout=30))[0] and await _outcome(first) == "open"
    assert await _open(run_socket) == "open"
    assert await _open(run_socket) == TOO_MANY_SOCKETS
    await first.disconnect()
    assert await _open(run_socket) == "open"


async def test_another_users_sockets_do_not_count_against_the_cap(run_socket, settings, other_user):
    settings.STUDIO_SOCKETS_PER_USER = 1
    layer = get_channel_layer()
    assert await sockets.hold_slot(layer.connection(0), layer.prefix, other_user.pk, "specific.elsewhere!x")
    assert await _open(run_socket) == "open"


async def test_the_slots_of_a_crashed_server_lapse(run_socket, settings, user):
    settings.STUDIO_SOCKETS_PER_USER, settings.SOCKET_SLOT_TTL_S = 1, 1.0
    layer = get_channel_layer()
    # a socket on a web server that died: its slot stays, nobody releases it
    assert await sockets.hold_slot(layer.connection(0), layer.prefix, user.pk, "specific.dead-server!x")
    assert await _open(run_socket) == TOO_MANY_SOCKETS
    await asyncio.sleep(1.2)
    assert await _open(run_socket) == "open"


async def test_an_open_socket_keeps_its_slot_past_the_ttl(run_socket, settings):
    settings.STUDIO_SOCKETS_PER_USER, settings.SOCKET_SLOT_TTL_S = 1, 0.6
    first = run_socket()
    assert (await first.connect(timeout=30))[0]
    assert await _outcome(first, wait_s=1.5) == "open"  # renewed every 0.2 s meanwhile
    assert await _open(run_socket) == TOO_MANY_SOCKETS


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"text_data": "not json {"}, INVALID_PAYLOAD),
        ({"bytes_data": b"\x00\x01"}, UNSUPPORTED_DATA),
        ({"text_data": "[" * 100_000 + "]" * 100_000}, INVALID_PAYLOAD),  # past the parser's recursion
    ],
    ids=["not-json", "binary", "nested-100000-deep"],
)
async def test_a_malformed_frame_closes_the_socket_with_a_code_not_an_error(run_socket, caplog, frame, code):
    communicator = run_socket()
    assert (await communicator.connect(timeout=30))[0]
    await communicator.send_to(**frame)
    await communicator.send_to(**frame)  # a second before the close is seen: still one close, no error
    assert await _outcome(communicator, wait_s=5) == code
    assert await communicator.receive_nothing(timeout=0.3)
    assert _errors(caplog) == []


async def test_a_json_frame_is_ignored(run_socket, caplog):
    communicator = run_socket()
    assert (await communicator.connect(timeout=30))[0]
    await communicator.send_json_to({"kind": "hello"})
    assert await _outcome(communicator) == "open"
    assert _errors(caplog) == []


async def test_redis_down_closes_the_socket_with_1013_not_a_500(run_socket, settings):
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["hosts"][0]["address"] = f"redis://127.0.0.1:{free_port()}/0"  # nobody there
    settings.CHANNEL_LAYERS = layers
    communicator = run_socket()
    connected, code = await communicator.connect(timeout=30)
    assert (await _outcome(communicator, wait_s=5) if connected else code) == TRY_AGAIN_LATER

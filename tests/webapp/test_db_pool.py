"""Database connections are pooled and bounded: more concurrent requests than the pool holds wait, then get a
503 with Retry-After (a socket: close code 1013), never a 500, and PostgreSQL never sees more connections than
the pool's bound times the web server's processes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection, connections
from django.test import Client
from psycopg_pool import PoolTimeout

from api.tokens import token_create
from tests.webapp.conftest import free_port
from webapp import dbpool, webserver
from webapp.asgi import application
from webapp.consumers import BUSY, TRY_AGAIN_LATER
from webapp.events import access_changed, user_group
from webapp.models import Run

REPO = Path(__file__).resolve().parents[2]
POOL_SIZE = 2
QUIET_S = 1.0
"""How long the pool must have held nothing free before a test calls it empty."""


def test_every_process_role_has_a_bounded_pool_and_says_who_it_is(monkeypatch):
    monkeypatch.setenv("STUDIO_DB_ROLE", "training")
    monkeypatch.delenv("STUDIO_DB_POOL_SIZE", raising=False)
    monkeypatch.delenv("STUDIO_DB_POOL_TIMEOUT", raising=False)
    options = dbpool.database_options()
    assert options["pool"]["max_size"] == dbpool.ROLE_DEFAULTS["training"].max_size
    assert options["application_name"] == "studio-training"
    monkeypatch.setenv("STUDIO_DB_POOL_WORKER", "7")
    assert dbpool.role_env("worker") == {"STUDIO_DB_ROLE": "worker", "STUDIO_DB_POOL_SIZE": "7"}
    monkeypatch.setenv("STUDIO_DB_POOL_SIZE", "0")
    with pytest.raises(ValueError, match="STUDIO_DB_POOL_SIZE must be >= 1"):
        dbpool.this_process()


def test_a_training_process_holds_a_pool_of_the_training_roles_size(settings, tmp_path, monkeypatch):
    """Started from a worker (its role inherited), the process that trains a run gets the training role:
    its heartbeat, the experience manager's threads and the extractor's track each keep a connection. A
    stand-in ``manage.py`` writes down what it was started with."""
    from webapp.supervisor import train_in_child

    keys = ("STUDIO_DB_ROLE", "STUDIO_DB_POOL_SIZE")
    (tmp_path / "manage.py").write_text(
        f"import json, os; json.dump({{k: os.environ[k] for k in {keys}}}, open('env.json', 'w'))"
    )
    settings.BASE_DIR = tmp_path
    monkeypatch.setenv("STUDIO_DB_ROLE", "worker")
    monkeypatch.setenv("STUDIO_DB_POOL_SIZE", "4")
    assert train_in_child(run_id=1) == 0
    started = json.loads((tmp_path / "env.json").read_text())
    assert started == {"STUDIO_DB_ROLE": "training", "STUDIO_DB_POOL_SIZE": "12"}


def test_settings_use_the_pool_and_no_persistent_connections():
    db = settings.DATABASES["default"]
    assert db["CONN_MAX_AGE"] == 0
    assert db["OPTIONS"]["pool"]["max_size"] >= 1


@contextmanager
def _pool_held_by_other_threads(*, keep_own: bool = True, timeout_s: float = 0.3) -> Iterator[None]:
    """Every connection of this process's real pool held by another thread (and this thread's own one, unless
    ``keep_own`` is false); a caller waits ``timeout_s``.

    The other thread drains the pool rather than counting what is out: in a long test session, threads of
    earlier tests return connections and the pool grows or replaces them in the background, so a count taken
    once can leave one free. It takes every connection it can, and keeps taking any that comes back, until
    the pool has held nothing free for ``QUIET_S``; only then is the pool empty."""
    if keep_own:
        connection.ensure_connection()  # this thread's, from the pool
    else:
        connection.close()
    pool = connection.pool
    release, quiet, taken = threading.Event(), threading.Event(), []

    def drain() -> None:
        empty_since = None
        while not release.is_set():
            try:
                taken.append(pool.getconn(timeout=0.05))
                empty_since = None
            except PoolTimeout:
                empty_since = empty_since or time.monotonic()
                if time.monotonic() - empty_since >= QUIET_S:
                    quiet.set()
        for conn in taken:
            pool.putconn(conn)

    drainer = threading.Thread(target=drain)
    drainer.start()
    try:
        assert quiet.wait(30), f"the pool never stayed empty ({len(taken)} connections taken)"
        pool.timeout = timeout_s
        yield
    finally:
        release.set()
        drainer.join()
        pool.timeout = dbpool.this_process()[1].timeout_s


@pytest.mark.django_db(transaction=True)
def test_a_request_that_finds_the_pool_empty_gets_a_503_with_retry_after(user):
    """Every connection of this process's real pool is held by other threads; a request in yet another thread
    waits the pool's timeout and is answered 503 (the page and the API alike), not 500."""
    client = Client(raise_request_exception=False)
    client.force_login(user)
    with _pool_held_by_other_threads(), ThreadPoolExecutor(1) as other_thread:  # a request's own thread
        page = other_thread.submit(client.get, "/").result()
        api = other_thread.submit(client.get, "/api/v1/runs").result()
    for response in (page, api):
        assert response.status_code == 503
        assert int(response["Retry-After"]) > 0
    assert b"busy" in page.content.lower()
    assert "busy" in api.json()["detail"]


@pytest.fixture
def watched(user) -> tuple[Run, list[tuple[bytes, bytes]]]:
    """A run of ``user``'s, and the headers of a socket of theirs."""
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    return Run.objects.create(name="watched", owner=user), [
        (b"origin", b"http://127.0.0.1:8000"),
        (b"cookie", cookie),
    ]


async def _connect(run: Run, headers) -> tuple[WebsocketCommunicator, bool, int | None]:
    socket = WebsocketCommunicator(application, f"/ws/runs/{run.id}/", headers=headers)
    connected, code = await socket.connect(timeout=20)
    return socket, connected, code


@pytest.mark.django_db(transaction=True)
def test_a_socket_handshake_that_finds_the_pool_empty_is_refused_with_1013_never_a_500(watched):
    """Its session and user could not be read in the pool's timeout: refused (a browser reconnects)."""
    with _pool_held_by_other_threads(keep_own=False):  # the handshake's reads run in this thread here
        _, connected, code = async_to_sync(_connect)(*watched)
    assert (connected, code) == (False, TRY_AGAIN_LATER)


@pytest.mark.django_db(transaction=True)
def test_an_open_socket_whose_access_check_finds_the_pool_empty_closes_with_1013_and_frees_its_slot(
    user, watched, settings
):
    from webapp.sockets import user_slots_key

    prefix = f"test-{uuid.uuid4().hex[:8]}"  # slots of its own: other test sessions share this Redis
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["prefix"] = prefix
    settings.CHANNEL_LAYERS = layers  # a new channel layer (Channels resets its layers on the change)

    async def access_check_with_the_pool_held() -> dict:
        socket, connected, _ = await _connect(*watched)
        assert connected
        # the socket's reads run in the loop's thread pool, which no request cycle ends in a test
        await sync_to_async(connections.close_all, thread_sensitive=False)()
        held = _pool_held_by_other_threads()
        await sync_to_async(held.__enter__)()  # in this test's thread, as the other tests hold it
        try:
            await sync_to_async(access_changed)(user_group(user.pk))
            closed = await socket.receive_output(timeout=20)
            await socket.wait(timeout=10)  # the consumer's end: it lets its groups and slot go
            return closed
        finally:
            await sync_to_async(held.__exit__)(None, None, None)

    closed = async_to_sync(access_check_with_the_pool_held)()
    assert closed == {"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": BUSY}
    with redis.Redis.from_url(settings.REDIS_URL) as conn:
        assert conn.zcard(user_slots_key(prefix, user.pk)) == 0  # released, not left to lapse


@pytest.fixture(params=[1, 2], ids=["1 process", "2 processes"])
def pooled_server(request, transactional_db):
    """The product's ASGI server (one process, or two sharing the port as ``manage.py up`` runs it), each
    process with a pool of POOL_SIZE connections, named so its connections can be counted in pg_stat_activity:
    ``(base URL, processes)``."""
    processes = request.param
    port = free_port()
    env = os.environ | {
        "STUDIO_DB_NAME": settings.DATABASES["default"]["NAME"],
        "DJANGO_SETTINGS_MODULE": "tests.e2e.settings_e2e",  # static files from the source folders
        "STUDIO_DB_ROLE": "pooltest",
        "STUDIO_DB_POOL_SIZE": str(POOL_SIZE),
        "STUDIO_DB_POOL_TIMEOUT": "0.5",
        "STUDIO_WARM_START": "false",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = REPO / "var" / "pooltest-webserver.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    command = webserver.command("127.0.0.1", port, processes=processes)
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(base + "/login/", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(log_path.read_text()) from None
            time.sleep(0.3)
    yield base, processes
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


def _server_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'studio-pooltest'")
        return cursor.fetchone()[0]


def _status(url: str, headers: dict[str, str]) -> tuple[int, str | None]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
            return response.status, None
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Retry-After")


def test_more_concurrent_requests_than_the_pool_holds_get_no_500_and_connections_stay_bounded(
    pooled_server, user
):
    """PostgreSQL sees at most the pool's size times the web server's processes."""
    base, processes = pooled_server
    run = Run.objects.create(owner=user, name="pooled", config={}, method="grpo", env="MiniHack-Room-5x5")
    client = Client()
    client.force_login(user)
    cookie = {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}
    token = {"Authorization": f"Bearer {token_create(user, name='load', scope='read')[1]}"}
    targets = [(f"{base}{path}", cookie) for path in ("/", f"/runs/{run.id}/", "/bank/")]
    targets += [(f"{base}/api/v1/runs", token), (f"{base}/api/v1/runs/{run.id}", token)]
    peak, stop = [0], threading.Event()

    def watch() -> None:
        from django.db import connection as own

        while not stop.is_set():
            peak[0] = max(peak[0], _server_connections())
            time.sleep(0.02)
        own.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(lambda t: _status(*t), targets * 24))
    finally:
        stop.set()
        watcher.join()
    codes = sorted({code for code, _ in answers})
    assert set(codes) <= {200, 503}, codes
    assert sum(code == 200 for code, _ in answers) > len(answers) // 4
    assert all(retry for code, retry in answers if code == 503)
    assert 1 <= peak[0] <= POOL_SIZE * processes
    assert _server_connections() <= POOL_SIZE * processes

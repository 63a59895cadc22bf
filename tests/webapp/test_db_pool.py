"""Database connections are pooled and bounded: more concurrent requests than the pool holds wait, then get a
503 with Retry-After, never a 500, and PostgreSQL never sees more connections than the pool's bound."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from api.tokens import token_create
from tests.webapp.conftest import free_port
from webapp import dbpool, webserver
from webapp.models import Run

REPO = Path(__file__).resolve().parents[2]
POOL_SIZE = 2


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


def test_settings_use_the_pool_and_no_persistent_connections():
    db = settings.DATABASES["default"]
    assert db["CONN_MAX_AGE"] == 0
    assert db["OPTIONS"]["pool"]["max_size"] >= 1


@pytest.mark.django_db(transaction=True)
def test_a_request_that_finds_the_pool_empty_gets_a_503_with_retry_after(user):
    """Every connection of this process's real pool is held by other threads; a request in yet another thread
    waits the pool's timeout and is answered 503 (the page and the API alike), not 500."""
    client = Client(raise_request_exception=False)
    client.force_login(user)
    connection.ensure_connection()  # this thread's, from the pool
    pool = connection.pool
    pool.timeout = 0.3
    release, held = threading.Event(), []

    def hold_one() -> None:
        from django.db import connection as own

        own.ensure_connection()
        held.append(1)
        release.wait(30)
        own.close()

    stats = pool.get_stats()  # connections out now: this thread's, and any an earlier test's thread kept
    out = stats.get("pool_size", 0) - stats.get("pool_available", 0)
    holders = [threading.Thread(target=hold_one) for _ in range(pool.max_size - out)]
    for t in holders:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(held) < len(holders):
            assert time.monotonic() < deadline, f"only {len(held)} of {len(holders)} connections were free"
            time.sleep(0.05)
        with ThreadPoolExecutor(1) as other_thread:  # a request's own thread, as under ASGI
            page = other_thread.submit(client.get, "/").result()
            api = other_thread.submit(client.get, "/api/v1/runs").result()
    finally:
        release.set()
        for t in holders:
            t.join()
        pool.timeout = dbpool.this_process()[1].timeout_s
    for response in (page, api):
        assert response.status_code == 503
        assert int(response["Retry-After"]) > 0
    assert b"busy" in page.content.lower()
    assert "busy" in api.json()["detail"]


@pytest.fixture
def pooled_server(transactional_db):
    """The product's ASGI server with a pool of POOL_SIZE connections, named so its connections can be
    counted in pg_stat_activity."""
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
    proc = subprocess.Popen(webserver.command("127.0.0.1", port), cwd=REPO, env=env, stdout=log, stderr=log)
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
    yield base
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
    run = Run.objects.create(owner=user, name="pooled", config={}, method="grpo", env="MiniHack-Room-5x5")
    client = Client()
    client.force_login(user)
    cookie = {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}
    token = {"Authorization": f"Bearer {token_create(user, name='load', scope='read')[1]}"}
    targets = [(f"{pooled_server}{path}", cookie) for path in ("/", f"/runs/{run.id}/", "/bank/")]
    targets += [(f"{pooled_server}/api/v1/runs", token), (f"{pooled_server}/api/v1/runs/{run.id}", token)]
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
    assert 1 <= peak[0] <= POOL_SIZE
    assert _server_connections() <= POOL_SIZE

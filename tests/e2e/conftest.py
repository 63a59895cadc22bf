"""A real server (the product's ASGI server, HTTP and WebSockets) on the test database, and a real headless
Chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from webapp import webserver

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run",
]  # fmt: skip


def wait_for_js(page, expression: str, timeout_s: float = 30, interval_ms: int = 50) -> None:
    """Poll a page expression from here: the pages' Content-Security-Policy forbids the string eval that
    Playwright's own ``wait_for_function`` runs inside the page."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        assert time.monotonic() < deadline, f"{expression} still false after {timeout_s} s"
        page.wait_for_timeout(interval_ms)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def training_queue():
    """The queue the test server sends launched runs to; emptied afterwards."""
    name = f"e2e-training-{uuid.uuid4().hex[:8]}"
    yield name
    from webapp.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(name)


@pytest.fixture
def server(transactional_db, training_queue):
    """The product's ASGI server serving the project against the test database; yields its base URL."""
    port = _free_port()
    env = os.environ | {
        "E2E_TRAINING_QUEUE": training_queue,
        "STUDIO_DB_NAME": settings.DATABASES["default"]["NAME"],
        "DJANGO_SETTINGS_MODULE": "tests.e2e.settings_e2e",
        "PYTHONUNBUFFERED": "1",
    }
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "webserver.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        webserver.command("127.0.0.1", port), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(base + "/login/", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError((ARTIFACTS / "webserver.log").read_text()) from None
            time.sleep(0.3)
    yield base
    proc.terminate()
    proc.wait(timeout=20)
    log.close()
    _remove_run_folders()


def _remove_run_folders() -> None:
    """The folders of the runs the test launched (the test database holds only those), so that the
    suite leaves nothing under the checkout's ``var/runs``."""
    from webapp.models import Run
    from webapp.training import run_dir

    for run in Run.objects.all():
        shutil.rmtree(run_dir(run), ignore_errors=True)


@pytest.fixture
def browser_page(monkeypatch):
    """A page in a fresh headless Chromium (its own profile folder). Playwright's sync API keeps an event
    loop in this thread, so the test's own ORM calls (setting up data, checking it) are allowed explicitly."""
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, accept_downloads=True,
            viewport={"width": 1400, "height": 1000},
        )  # fmt: skip
        page = context.new_page()
        page.set_default_timeout(90_000)  # the first bank edit loads the embedding model in the server
        yield page
        context.close()

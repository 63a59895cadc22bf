"""The product's own commands, run as a person runs them, each in a fresh data folder."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest
import redis

from trainer.models import default_model_path
from trainer.paths import var_dir

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fresh_var():
    """Environment for a product whose data lives in a new folder, on ports nobody else uses.

    Not pytest's tmp_path: its parents are private to root, and PostgreSQL runs as another user.
    """
    tmp_path = Path(tempfile.mkdtemp(prefix="fresh-", dir=var_dir()))
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "STUDIO_DB_NAME"}}
    env |= {
        "STUDIO_VAR": str(tmp_path / "var"),
        "STUDIO_REDIS_PORT": str(_free_port()),
        "STUDIO_MODELS": str(default_model_path().parent),
        "PYTHONUNBUFFERED": "1",
    }
    yield env
    subprocess.run([sys.executable, "manage.py", "services", "stop"], cwd=REPO, env=env, capture_output=True)
    shutil.rmtree(tmp_path, ignore_errors=True)


def _manage(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _pg(env: dict) -> psycopg.Connection:
    socket_dir = Path(env["STUDIO_VAR"]) / "pg"
    return psycopg.connect(host=str(socket_dir), dbname="studio", user="postgres", autocommit=True)


def test_stopping_and_restarting_the_services_keeps_the_data(fresh_var):
    assert "started: postgres, redis" in _manage(fresh_var, "services", "start")
    with _pg(fresh_var) as conn:
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('still here')")
    r = redis.Redis(port=int(fresh_var["STUDIO_REDIS_PORT"]))
    r.set("kept", "also here")

    stopped = _manage(fresh_var, "services", "stop")
    assert "stopped: postgres, redis" in stopped
    assert re.search(r"postgres\s+stopped", stopped) and re.search(r"redis\s+stopped", stopped)

    _manage(fresh_var, "services", "start")
    with _pg(fresh_var) as conn:
        assert conn.execute("SELECT note FROM kept").fetchone() == ("still here",)
    assert r.get("kept") == b"also here"


def _get(opener, url: str) -> tuple[int, str]:
    with opener.open(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_the_run_command_serves_the_login_page_with_a_worker_and_ctrl_c_stops_everything(fresh_var):
    port = _free_port()
    env = fresh_var | {"STUDIO_ADMIN_PASSWORD": "a long test password", "STUDIO_PORT": str(port)}
    up = subprocess.Popen(
        [sys.executable, "manage.py", "up"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        jar = CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                status, page = _get(opener, base + "/login/")
                break
            except OSError:
                assert up.poll() is None, up.stdout.read()
                assert time.monotonic() < deadline, "the web server did not come up in 180 s"
                time.sleep(0.5)
        assert status == 200 and "Log in" in page

        # The admin account works: log in with the CSRF token from the form, reach the dashboard.
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        credentials = {"username": "admin", "password": env["STUDIO_ADMIN_PASSWORD"]}
        form = urlencode(credentials | {"csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(base + "/login/", data=form, headers={"Referer": base + "/login/"})
        with opener.open(request, timeout=10) as response:
            assert response.status == 200 and "Runs" in response.read().decode()

        deadline = time.monotonic() + 90
        while "pong" not in (ping := _celery_ping(env)):
            assert time.monotonic() < deadline, f"no Celery worker answered: {ping}"
            time.sleep(1)
    finally:
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=90)
    assert up.returncode == 0, output
    assert "stopped: web, worker, postgres, redis" in output
    status = _manage(fresh_var, "services", "status")
    assert re.search(r"postgres\s+stopped", status) and re.search(r"redis\s+stopped", status)


def _celery_ping(env: dict) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "webapp", "inspect", "ping", "-t", "3"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout + done.stderr

"""The product's own commands, run as a person runs them, each in a fresh data folder (``fresh_var``)."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import redis

from tests.webapp.conftest import manage, run_manage


def _pg(env: dict) -> psycopg.Connection:
    socket_dir = Path(env["STUDIO_VAR"]) / "pg"
    return psycopg.connect(host=str(socket_dir), dbname="studio", user="postgres", autocommit=True)


def test_stopping_and_restarting_the_services_keeps_the_data(fresh_var):
    assert "started: postgres, redis" in manage(fresh_var, "services", "start")
    with _pg(fresh_var) as conn:
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('still here')")
    r = redis.Redis(port=int(fresh_var["STUDIO_REDIS_PORT"]))
    r.set("kept", "also here")

    stopped = manage(fresh_var, "services", "stop")
    assert "stopped: postgres, redis" in stopped
    assert re.search(r"postgres\s+stopped", stopped) and re.search(r"redis\s+stopped", stopped)

    manage(fresh_var, "services", "start")
    with _pg(fresh_var) as conn:
        assert conn.execute("SELECT note FROM kept").fetchone() == ("still here",)
    assert r.get("kept") == b"also here"


def _manage_refused(env: dict, *args: str) -> str:
    done = run_manage(env, *args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_a_command_without_its_database_says_what_to_run(fresh_var):
    down = _manage_refused(fresh_var, "experiment", "status", "configs/experiments/room-5x5.toml")
    assert "cannot reach the database" in down and "services start" in down

    manage(fresh_var, "services", "start")
    unmigrated = _manage_refused(fresh_var, "export_run", "1")
    assert "lacks" in unmigrated and "manage.py migrate" in unmigrated

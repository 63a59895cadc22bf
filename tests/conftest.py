"""Shared fixtures: the real embedded services, a real Celery worker, logged-in users.

Tests that touch the database get PostgreSQL + pgvector (pytest-django creates ``test_studio_<pid>``);
the embedded servers are started once per session, and stopped at the end if this session
started them. Nothing here is mocked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from trainer.paths import var_dir
from webapp import embedded

REPO = Path(__file__).resolve().parent.parent

# Production serves hashed files collected by `collectstatic`; tests render templates without it.
settings.STORAGES = settings.STORAGES | {
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
}
Path(settings.STATIC_ROOT).mkdir(parents=True, exist_ok=True)
# The test process is many clients at once (async tests' event-loop threads, live-server threads, each
# keeping a connection until its thread ends): a larger pool than a web server's, still bounded.
settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"] = 30


@pytest.fixture(scope="session")
def embedded_services():
    started = embedded.start_all()
    if embedded.uses_embedded_postgres():
        settings.DATABASES["default"]["HOST"] = str(embedded.pg_socket_dir())
    yield
    embedded.stop_all(only=started)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(embedded_services, django_db_modify_db_settings_parallel_suffix):
    """pytest-django's hook before it creates the test database: the servers must run by then."""


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """Before pytest-django drops the test database, end sessions it cannot drop under (socket threads)."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    """Poll ``predicate`` until it returns something truthy (returned), failing after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
    return value


@contextmanager
def workers_running(commands: list[list[str]]):
    """Real Celery worker processes started with ``commands`` (each names its node with ``--hostname``),
    using the test database; all started before waiting for any; stopped, with their pools, on exit."""
    env = os.environ | {"STUDIO_DB_NAME": settings.DATABASES["default"]["NAME"], "PYTHONUNBUFFERED": "1"}
    here = os.uname().nodename
    nodes = [command[command.index("--hostname") + 1].replace("%h", here) for command in commands]
    logs = [var_dir() / f"celery-{node.split('@')[0]}.log" for node in nodes]
    workers = []
    with ExitStack() as stack:
        for command, log_path in zip(commands, logs, strict=True):
            log = stack.enter_context(log_path.open("w"))
            workers.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        stack.callback(_stop_workers, workers)
        from webapp.celery import app

        deadline = time.monotonic() + 180  # start-up imports torch and Django: slow on a busy machine
        for worker, node, log_path in zip(workers, nodes, logs, strict=True):
            while not _started(app, node, log_path):
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the test Celery worker did not start: {log_path.read_text()}")
        yield nodes


def _started(app, node: str, log_path: Path) -> bool:
    """The worker answers a ping, or has logged that it is ready: a solo pool that took a queued task the
    moment it started answers pings only once that task ends."""
    return f"{node} ready." in log_path.read_text(errors="replace") or bool(
        app.control.ping(destination=[node], timeout=1.0)
    )


def _stop_workers(workers: list[subprocess.Popen]) -> None:
    """A warm shutdown (running tasks finish) for 30 s; then the worker and its pool processes are killed."""
    pools = {worker.pid: _descendants(worker.pid) for worker in workers}
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            for proc in pools[worker.pid]:
                with suppress(psutil.NoSuchProcess):
                    proc.kill()
            worker.wait()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@contextmanager
def worker_on(queue: str):
    """A real Celery worker process consuming ``queue``, using the test database; stopped on exit."""
    command = [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", queue, "--pool", "solo",
               "--hostname", f"{queue}@%h", "--loglevel", "INFO", "--without-gossip",
               "--without-mingle"]  # fmt: skip
    with workers_running([command]):
        yield queue


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker):
    """A real Celery worker process on a queue of its own, using the test database."""
    with worker_on(f"test-{uuid.uuid4().hex[:8]}") as queue:
        yield queue


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("bob", password="correct horse battery")

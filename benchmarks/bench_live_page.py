"""The live run page under load: WebSocket viewers on a run that publishes as training does, while a large
bank import runs. Prints disconnects, event latency (publish to arrival), and the web server's memory.

    .venv/bin/python benchmarks/bench_live_page.py [--viewers 50] [--import-mb 50] [--rate 2]

It runs the product's web server (uvicorn, ``webapp.webserver``; ``--server daphne`` for the old one) on
``webapp.asgi`` and a real Celery worker (``default`` queue, as ``manage.py up``
starts it) on a database of its own (``bench_live``, dropped at the end) and a Redis database of its own,
so nothing else running on the machine sees its runs, events or tasks. Events go through the product's own
path (``webapp.progress.RunReporter``: a metric row then a broadcast, and trace events), ``--rate`` per
second; the import is posted to the bank page as a person would (a JSONL export: half the entries carry
their embeddings, half must be embedded). Viewers reconnect like the page does (``?since=`` the last row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.outputs import write_output  # noqa: E402
from webapp import webserver  # noqa: E402  (the repository on the path first)

DB_NAME = "bench_live"
REDIS_DB = 9
SERVERS = {
    "uvicorn": lambda host, port: webserver.command(host, port),
    "daphne": lambda host, port: [sys.executable, "-m", "daphne", "-b", host, "-p", str(port),
                                  "webapp.asgi:application"],
}  # fmt: skip


def _env(redis_port: int) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/{REDIS_DB}",
        "STUDIO_DB_NAME": DB_NAME,
        "STUDIO_CHANNEL_PREFIX": "bench-live",
        "PYTHONUNBUFFERED": "1",
    }


def _setup_django(env: dict[str, str]) -> None:
    os.environ.update(env)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.conf import settings

    from webapp import embedded

    settings.DATABASES["default"]["HOST"] = str(embedded.pg_socket_dir())


def _create_database() -> None:
    import psycopg

    from webapp import embedded

    conninfo = {"host": str(embedded.pg_socket_dir()), "user": embedded.DB_USER, "dbname": "postgres"}
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")  # the bench's own: start afresh
        conn.execute(f"CREATE DATABASE {DB_NAME}")


def _drop_database() -> None:
    import psycopg
    from django.db import connections

    from webapp import embedded

    connections.close_all()
    conninfo = {"host": str(embedded.pg_socket_dir()), "user": embedded.DB_USER, "dbname": "postgres"}
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _export_file(path: Path, megabytes: float, dim: int, model_id: str) -> int:
    """A JSONL export of about ``megabytes``: entries with their embeddings (most of the bytes) and as many
    entries without, which the worker must embed. Returns the number of lines."""
    rng = np.random.default_rng(0)
    target = megabytes * 1e6
    size = lines = 0
    with path.open("w") as out:
        while size < target:
            record = {
                "format": "complementary-rl-experience/1",
                "scope": "MiniHack",
                "title": f"Imported hint {lines}",
                "content": f"Entry {lines}: walk toward the staircase down, then descend; "
                f"avoid the monster at {rng.integers(0, 99)} steps. " * 4,
            }
            if lines % 2 == 0:
                vector = rng.standard_normal(dim)
                vector /= np.linalg.norm(vector)
                record |= {"embedding_model": model_id, "embedding": vector.tolist()}
            line = json.dumps(record) + "\n"
            out.write(line)
            size += len(line)
            lines += 1
    return lines


def _publish(env: dict[str, str], run_id: int, rate: float, stop, sent) -> None:
    """A training run's events: every second event a metric row (then its broadcast), the others traces."""
    _setup_django(env)
    from webapp.models import Run
    from webapp.progress import RunReporter

    reporter = RunReporter(Run.objects.get(pk=run_id))
    step = 0
    next_at = time.monotonic()
    while not stop.is_set():
        now = time.time()
        if step % 2 == 0:
            reporter.on_step(step, {"train/success": (step % 10) / 10, "bench/sent_at": now})
        else:
            reporter.on_trace(step, {"sent_at": now, "query": "how do I reach the stairs?"})
        step += 1
        sent.value = step
        next_at += 1 / rate
        time.sleep(max(0.0, next_at - time.monotonic()))


class Viewers:
    """N WebSocket viewers of one run; each reconnects as the page does, from the last row it saw."""

    def __init__(self, url: str, origin: str, cookies: list[str]) -> None:
        self.url, self.origin, self.cookies = url, origin, cookies
        self.latencies: list[float] = []
        self.received = [set() for _ in cookies]
        self.dropped = 0
        """Sockets closed after they were open (what the issue counted as disconnects)."""
        self.refused = 0
        """Handshakes that failed (the server too slow to accept, or refusing)."""
        self.closing = False

    async def watch(self, i: int) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, WebSocketException

        cursor = 0
        while not self.closing:
            opened = False
            try:
                async with connect(
                    f"{self.url}?since={cursor}" if cursor else self.url,
                    origin=self.origin,
                    additional_headers={"Cookie": f"sessionid={self.cookies[i]}"},
                    open_timeout=60,
                ) as ws:
                    opened = True
                    async for raw in ws:
                        event, arrived = json.loads(raw), time.time()
                        sent_at = event.get("values", {}).get("bench/sent_at") or event.get("sent_at")
                        if sent_at is None or (event["kind"], event["step"]) in self.received[i]:
                            continue
                        self.received[i].add((event["kind"], event["step"]))
                        self.latencies.append(arrived - float(sent_at))
                        cursor = max(cursor, event.get("id", 0))
            except (ConnectionClosed, WebSocketException, OSError, TimeoutError):
                pass
            if not self.closing:
                self.dropped += opened
                self.refused += not opened
                await asyncio.sleep(1)


def _session_cookies(user, n: int) -> list[str]:
    from django.test import Client

    cookies = []
    for _ in range(n):
        client = Client()
        client.force_login(user)
        cookies.append(client.cookies["sessionid"].value)
    return cookies


def _post_import(base: str, run_id: int, cookie: str, path: Path) -> float:
    """Upload the file on the bank page, as the browser's form does; returns the request's seconds."""
    import requests

    session = requests.Session()
    session.cookies.set("sessionid", cookie)
    page = session.get(f"{base}/runs/{run_id}/bank/", timeout=120)
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found, f"no import form on the bank page ({page.status_code}): {page.text[:500]}"
    token = found.group(1)
    started = time.monotonic()
    with path.open("rb") as f:
        response = session.post(
            f"{base}/runs/{run_id}/bank/import/",
            data={"csrfmiddlewaretoken": token},
            files={"file": ("bank.jsonl", f, "application/jsonl")},
            headers={"Referer": f"{base}/runs/{run_id}/bank/"},
            timeout=600,
        )
    response.raise_for_status()
    return time.monotonic() - started


def _search(base: str, run_id: int, cookie: str) -> tuple[float, str]:
    """Seconds of a search by meaning, and the cut-off line the page stated."""
    import requests

    started = time.monotonic()
    page = requests.get(
        f"{base}/runs/{run_id}/bank/", params={"q": "reach the stairs", "mode": "semantic"},
        cookies={"sessionid": cookie}, timeout=600,
    ).text  # fmt: skip
    line = re.search(r'id="search-cutoff">([^<]*)<', page)
    return time.monotonic() - started, line.group(1) if line else "(no cut-off line)"


def _warm(base: str, run_id: int, cookie: str, timeout: float = 600) -> float:
    """Seconds until search by meaning is served (the web server's warm start has loaded the model)."""
    started = time.monotonic()
    while not _search(base, run_id, cookie)[1].startswith("By meaning"):
        assert time.monotonic() - started < timeout, "the web server did not load the embedding model"
        time.sleep(1)
    return time.monotonic() - started


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the server exited ({proc.returncode})"
        try:
            requests.get(url, timeout=5)
            return
        except requests.RequestException:
            assert time.monotonic() < deadline, f"{url} did not answer in {timeout} s"
            time.sleep(0.5)


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        import psutil

        self.proc = psutil.Process(pid)
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.samples.append(self.proc.memory_info().rss / 2**30)


def _import_status(run_id: int) -> tuple[str, str]:
    from experience.models import ImportJob

    job = ImportJob.objects.filter(run_id=run_id).order_by("-id").first()
    return (job.status, job.error) if job else ("not yet", "")


async def _measure(args, base: str, run_id: int, cookies: list[str], export: Path, env: dict):
    from asgiref.sync import sync_to_async

    viewers = Viewers(f"ws://{base.removeprefix('http://')}/ws/runs/{run_id}/", base, cookies[1:])
    tasks = [asyncio.create_task(viewers.watch(i)) for i in range(args.viewers)]
    await asyncio.sleep(5)  # every viewer connected
    ctx = mp.get_context("spawn")
    stop, sent = ctx.Event(), ctx.Value("i", 0)
    publisher = ctx.Process(target=_publish, args=(env, run_id, args.rate, stop, sent), daemon=True)
    publisher.start()
    try:
        await asyncio.sleep(10)  # a baseline before the import
        started = time.monotonic()
        post_s = await asyncio.to_thread(_post_import, base, run_id, cookies[0], export)
        status, error = "queued", ""
        while status not in ("succeeded", "failed") and time.monotonic() - started < args.timeout:
            await asyncio.sleep(2)
            status, error = await sync_to_async(_import_status)(run_id)
        import_s = time.monotonic() - started
        await asyncio.sleep(10)  # the page after the import
    finally:
        stop.set()
        await asyncio.to_thread(publisher.join)
    await asyncio.sleep(5)  # the last events arrive
    viewers.closing = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return viewers, sent.value, post_s, import_s, status, error


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--viewers", type=int, default=50)
    parser.add_argument("--import-mb", type=float, default=50)
    parser.add_argument("--rate", type=float, default=2.0, help="events per second the run publishes")
    parser.add_argument("--timeout", type=float, default=1200, help="most seconds to wait for the import")
    parser.add_argument("--keep", action="store_true", help="keep the bench database and logs")
    parser.add_argument("--server", choices=sorted(SERVERS), default="uvicorn", help="the ASGI server")
    args = parser.parse_args()

    from webapp import embedded

    env = _env(embedded.redis_port())
    _setup_django(env)
    import redis

    redis.Redis.from_url(env["REDIS_URL"]).flushdb()  # the bench's own Redis database: no stale groups
    _create_database()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from experience.embedding import DEFAULT_MODEL_ID
    from webapp.models import Run

    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # as `manage.py up` does
    user = User.objects.filter(username="bench").first()
    user = user or User.objects.create_superuser("bench", "", "a long bench password")
    run = Run.objects.create(name="live page bench", owner=user, status=Run.Status.RUNNING)
    cookies = _session_cookies(user, args.viewers + 1)
    export = Path(tempfile.mkdtemp()) / "bank.jsonl"
    lines = _export_file(export, args.import_mb, 384, DEFAULT_MODEL_ID)
    size_mb = export.stat().st_size / 1e6

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    child_env = os.environ | env
    logs = Path(tempfile.mkdtemp(prefix="bench-live-"))
    python = sys.executable
    web = subprocess.Popen(
        SERVERS[args.server]("127.0.0.1", port),
        cwd=REPO, env=child_env, stdout=(logs / "server.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = subprocess.Popen(
        [python, "-m", "celery", "-A", "webapp", "worker", "-Q", "default", "--concurrency", "1",
         "--hostname", f"bench-live-{port}@%h", "--loglevel", "INFO"],
        cwd=REPO, env=child_env, stdout=(logs / "worker.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        started = time.monotonic()
        _wait_http(f"{base}/login/", web)
        up_s = time.monotonic() - started
        search_s, cutoff = _search(base, run.id, cookies[0])
        warm_s = up_s + _warm(base, run.id, cookies[0])  # viewers come once the server has fully started
        rss = RssSampler(web.pid)
        rss.start()
        viewers, sent, post_s, import_s, status, error = asyncio.run(
            _measure(args, base, run.id, cookies, export, env)
        )
        rss.stop.set()
        tracebacks = (logs / "server.log").read_text().count("Traceback")
    finally:
        for proc in (web, worker):
            proc.terminate()
        for proc in (web, worker):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        export.unlink(missing_ok=True)
        if not args.keep:
            _drop_database()
            redis.Redis.from_url(env["REDIS_URL"]).flushdb()

    lat = np.array(viewers.latencies)
    missing = sum(sent - len(r) for r in viewers.received)
    print(f"server {args.server}; viewers {args.viewers}, "
          f"run publishing {args.rate:g} events/s (half metric rows, half traces)")  # fmt: skip
    print(f"web server answered {up_s:.1f} s after start; first search by meaning {search_s:.2f} s: {cutoff}")
    print(f"model loaded (search by meaning served) {warm_s:.0f} s after start; viewers connected after that")
    print(f"import: {size_mb:.0f} MB, {lines} lines, "
          f"upload request {post_s:.1f} s, import {status} after {import_s:.0f} s {error[:200]}")  # fmt: skip
    print(f"events: {sent} published, {len(lat)} delivered over all viewers, {missing} missed (all viewers)")
    print(f"disconnects: {viewers.dropped} (open sockets closed), {viewers.refused} refused handshakes; "
          f"tracebacks in the web server's log: {tracebacks}")  # fmt: skip
    if len(lat):
        p50, p95, p99 = np.percentile(lat, [50, 95, 99])
        print(f"event latency: p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
              f"max {lat.max() * 1000:.0f} ms")  # fmt: skip
    print(f"web server RSS: start {rss.samples[0]:.2f} GiB, peak {max(rss.samples):.2f} GiB, "
          f"end {rss.samples[-1]:.2f} GiB")  # fmt: skip
    print(f"logs: {logs}")
    ms = [round(float(v) * 1000) for v in np.percentile(lat, [50, 95, 99, 100])] if len(lat) else [None] * 4
    row = {"server": args.server, "viewers": args.viewers, "disconnects": viewers.dropped,
           "refused handshakes": viewers.refused, "events missed": f"{missing} of {sent} × {args.viewers}",
           "p50 ms": ms[0], "p95 ms": ms[1], "p99 ms": ms[2], "max ms": ms[3],
           "web server RSS (start / peak / end) GiB":
               f"{rss.samples[0]:.2f} / {max(rss.samples):.2f} / {rss.samples[-1]:.2f}",
           "import": f"{size_mb:.0f} MB, {status} after {import_s:.0f} s",
           "tracebacks": tracebacks}  # fmt: skip
    write_output("live-page", {"rows": [row]})


if __name__ == "__main__":
    main()

"""A ~50 MB bank import through a real web server: how much does its memory grow, how long does it take?

Starts daphne (the production ASGI server) and a Celery worker on the ``default`` queue as subprocesses, on a
database (``bench_import``) and a Redis database of their own, logs in over HTTP, uploads a generated JSONL
export to a run's bank and follows the import to its end. RSS of the web server (and of the worker) is
sampled every 50 ms with psutil; figures are printed, nothing is asserted.

    .venv/bin/python benchmarks/bench_import_memory.py                 # ~50 MB, lines carry their vectors
    .venv/bin/python benchmarks/bench_import_memory.py --mb 5 --embed  # lines without vectors: all embedded
    .venv/bin/python benchmarks/bench_import_memory.py --server uvicorn   # the same through uvicorn

An export of this studio carries each entry's vector (``--embed`` leaves them out, so the worker embeds every
entry: on 2 busy cores that is ~100 entries/s, so use a smaller file).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.outputs import write_output  # noqa: E402
from webapp import webserver  # noqa: E402  (the repository on the path first)

DB = "bench_import"
PASSWORD = "bench import password"


SERVERS = {
    "daphne": lambda port: [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                            "webapp.asgi:application"],
    "uvicorn": lambda port: webserver.command("127.0.0.1", port),
}  # fmt: skip
"""The ASGI servers compared: daphne, and uvicorn (what ``manage.py up`` and the Docker image run)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_export(path: Path, mb: float, with_vectors: bool) -> int:
    """Lines in the export format, each ~1 KB of text (plus its 384 floats unless ``with_vectors`` is off)."""
    rng = random.Random(0)
    words = "door key boulder stairs monster fountain potion wand ring corridor altar scroll".split()
    n, target = 0, int(mb * 1_000_000)
    with path.open("w", encoding="utf-8") as out:
        while out.tell() < target:
            content = " ".join(rng.choice(words) for _ in range(150))
            record = {"format": "complementary-rl-experience/1", "scope": f"scope-{n % 7}",
                      "title": f"Lesson {n}: {content[:40]}", "content": content}  # fmt: skip
            if with_vectors:
                v = [rng.gauss(0, 1) for _ in range(384)]
                norm = sum(x * x for x in v) ** 0.5
                record |= {"embedding_model": "all-MiniLM-L6-v2", "embedding": [x / norm for x in v]}
            out.write(json.dumps(record) + "\n")
            n += 1
    return n


def django_env() -> dict[str, str]:
    from webapp import embedded

    return os.environ | {
        "STUDIO_DB_NAME": DB, "REDIS_URL": embedded.embedded_redis_url(7),
        "STUDIO_CHANNEL_PREFIX": "bench-import", "DEBUG": "false", "PYTHONUNBUFFERED": "1",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
    }  # fmt: skip


def prepare_database(env: dict[str, str]) -> None:
    from webapp import embedded

    embedded.start_all()
    import psycopg

    with psycopg.connect(host=str(embedded.pg_socket_dir()), user=embedded.DB_USER, dbname="postgres") as c:
        c.autocommit = True
        c.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {DB}")
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True)


def make_editor_and_run(env: dict[str, str]) -> int:
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.contrib.auth.models import Permission, User

    from webapp.models import Run

    user = User.objects.create_user("bench", password=PASSWORD)
    user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    return Run.objects.create(name="import benchmark", owner=user).pk


class Sampler(threading.Thread):
    """The largest RSS of each process seen since start (every ``interval`` s)."""

    def __init__(self, processes: dict[str, psutil.Process], interval: float = 0.05):
        super().__init__(daemon=True)
        self.processes, self.interval = processes, interval
        self.peak = {name: p.memory_info().rss for name, p in processes.items()}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for name, p in self.processes.items():
                self.peak[name] = max(self.peak[name], _rss(p))
            time.sleep(self.interval)


def _rss(p: psutil.Process) -> int:
    """RSS of a process and its children (daphne and the solo worker run in one process each)."""
    total = p.memory_info().rss
    for child in p.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def settle(procs: dict[str, psutil.Process], quiet_s: float = 10, timeout: float = 300) -> None:
    """Wait until no process's RSS has moved by more than 5 MiB for ``quiet_s`` (start-up work such as an
    embedder warm-up has ended), so that growth is measured from a steady baseline."""
    deadline = time.monotonic() + timeout
    last, since = {n: _rss(p) for n, p in procs.items()}, time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(1)
        now = {n: _rss(p) for n, p in procs.items()}
        if any(abs(now[n] - last[n]) > 5 * 2**20 for n in procs):
            last, since = now, time.monotonic()


def wait_http(url: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.get(url, timeout=30)
            return
        except requests.RequestException:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer")


def login(base: str) -> requests.Session:
    s = requests.Session()
    page = s.get(f"{base}/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    form = {"username": "bench", "password": PASSWORD, "csrfmiddlewaretoken": token}
    r = s.post(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"})
    assert "sessionid" in s.cookies, r.text[:500]
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the generated file (MB)")
    parser.add_argument("--server", choices=sorted(SERVERS), default="daphne", help="the ASGI server")
    parser.add_argument("--embed", action="store_true", help="lines without vectors: the worker embeds all")
    parser.add_argument("--timeout", type=float, default=1800, help="give up following the import after (s)")
    args = parser.parse_args()
    env = django_env()
    prepare_database(env)
    run_id = make_editor_and_run(env)
    from experience.models import ImportJob

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bank.jsonl"
        lines = write_export(path, args.mb, with_vectors=not args.embed)
        size = path.stat().st_size
        port = free_port()
        logs = Path(tmp)
        server = subprocess.Popen(
            SERVERS[args.server](port),
            # DEBUG: static URLs without collectstatic's manifest (the worker keeps DEBUG off: no query log)
            cwd=REPO,
            env=env | {"DEBUG": "true"},
            stdout=(logs / "web.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", "default", "--pool", "solo",
             "--hostname", f"bench-import-{port}@%h", "--without-gossip", "--without-mingle"],
            cwd=REPO, env=env, stdout=(logs / "worker.log").open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/login/")
            session = login(base)
            bank_url = f"{base}/runs/{run_id}/bank/"
            for _ in range(3):  # warm: templates, sessions
                session.get(bank_url)
            procs = {"web server": psutil.Process(server.pid), "worker": psutil.Process(worker.pid)}
            settle(procs)
            before = {name: _rss(p) for name, p in procs.items()}
            sampler = Sampler(procs)
            sampler.start()
            t0 = time.monotonic()
            with path.open("rb") as f:
                response = session.post(
                    f"{base}/runs/{run_id}/bank/import/",
                    files={"file": ("bank.jsonl", f, "application/jsonl")},
                    data={"csrfmiddlewaretoken": session.cookies["csrftoken"]},
                    headers={"Referer": bank_url},
                    allow_redirects=False,
                )
            t_request = time.monotonic() - t0
            job = ImportJob.objects.filter(run_id=run_id).first()
            while job and not job.finished and time.monotonic() - t0 < args.timeout:
                time.sleep(0.5)
                job.refresh_from_db()
            t_total = time.monotonic() - t0
            sampler.stop.set()
            sampler.join()
            after = {name: _rss(p) for name, p in procs.items()}
        finally:
            for p in (server, worker):
                p.terminate()
                p.wait(timeout=60)
        mib = 2**20
        vectors = "without" if args.embed else "with"
        print(f"server: {args.server}; file: {size / 1e6:.1f} MB, {lines} lines ({vectors} vectors)")
        print(f"upload request: HTTP {response.status_code} in {t_request:.1f} s")
        if job is None:
            print("no import job was created (refused):", response.text[:300])
        else:
            print(f"import: {job.status} ({job.entries} entries) {t_total:.1f} s after the upload started"
                  + (f"; error: {job.error[:300]}" if job.error else ""))  # fmt: skip
        for name in procs:
            growth = (sampler.peak[name] - before[name]) / mib
            print(
                f"{name}: RSS {before[name] / mib:.0f} MiB before, peak {sampler.peak[name] / mib:.0f} MiB "
                f"(+{growth:.0f} MiB), {after[name] / mib:.0f} MiB after"
            )
        figures = {"server": args.server, "file MB": round(size / 1e6, 1), "lines": lines,
                   "vectors": vectors, "upload HTTP status": response.status_code,
                   "upload request s": round(t_request, 1), "import": job.status if job else "not created",
                   "entries": job.entries if job else None, "import s": round(t_total, 1)}  # fmt: skip
        for name in procs:
            for when, value in (("before", before), ("peak", sampler.peak), ("after", after)):
                figures[f"{name} RSS {when} MiB"] = round(value[name] / mib)
            figures[f"{name} growth MiB"] = round((sampler.peak[name] - before[name]) / mib)
        write_output(f"import-memory-{args.server}", figures)


if __name__ == "__main__":
    main()

"""The server's own cost of each request ``bench_load.py`` sends: time and database queries per page and API
call, on a database shaped like the load bench's (50 users, a running shared run with its metric rows,
episodes and traces, a bank of imported entries).

    .venv/bin/python benchmarks/bench_request_cost.py [--repeat 100] [--bank 5000] [--profile PATH]

Requests go through the product's ASGI application as uvicorn calls it (the middleware, the session and
token lookups, the thread hops of ``sync_to_async``, the view, the template or the JSON), one at a time, so
the figures are CPU and database time without queueing; and, taking turns with it, through the same
application with Django's own ASGI handler, to compare. The CPU time is this process's (every thread, not the
database server's), which a busy machine changes less than the wall time. ``--profile PATH`` runs
pyinstrument (when installed) over the requests of that path and prints where their time went.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("STUDIO_WARM_START", "false")
os.environ.setdefault("STUDIO_API_RATE", "100000/min")

from bench_dashboard import KEYS  # noqa: E402
from bench_load import API, PAGES, _users  # noqa: E402
from throwaway_db import throwaway_database  # noqa: E402

from benchmarks.outputs import write_output  # noqa: E402


def _fill(users: int, steps: int, bank: int) -> tuple[int, list[dict]]:
    """The load bench's database, as it is a minute into the load: returns the run's id and the users."""
    import numpy as np
    from django.contrib.auth.models import User

    from experience.models import Experience, SearchAsk
    from trainer.config import get_preset
    from webapp.models import EpisodeRecord, MetricRow, Run

    people = _users(users)
    run = Run.objects.create(
        name="load bench run", owner=User.objects.get(username=people[0]["name"]), shared=True,
        status=Run.Status.RUNNING,
        config=get_preset("cpu").to_dict(), step=steps, worker=f"training@host:{os.getpid()}",
    )  # fmt: skip
    rng = random.Random(0)
    MetricRow.objects.bulk_create(
        MetricRow(run=run, step=s, wall_time=s * 3.0, values={k: rng.random() for k in KEYS})
        for s in range(steps)
    )
    turns = [{"observation": "You see a room. " * 20, "action": "move east", "reward": 0.0}] * 10
    EpisodeRecord.objects.bulk_create(
        EpisodeRecord(run=run, step=s, task_instance=t, env=run.env, seed=t, guided=bool(k), reward=0.0,
                      success=False, num_actions=10, turns=turns)
        for s in range(steps) for t in range(2) for k in range(2)
    )  # fmt: skip
    vectors = np.random.default_rng(0).standard_normal((bank, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    Experience.objects.bulk_create(
        (
            Experience(run=run, title=f"Imported hint {i}", content="walk toward the staircase down " * 8,
                       embedding=vectors[i], scope="MiniHack")
            for i in range(bank)
        ),
        batch_size=1000,
    )  # fmt: skip
    SearchAsk.objects.bulk_create(SearchAsk(run=run, query="how do I reach the stairs?") for _ in range(30))
    return run.id, people


async def _get(app, path: str, auth: dict) -> int:
    """One GET through the product's ASGI application, as uvicorn hands it a request; its status."""
    from urllib.parse import urlsplit

    url = urlsplit(path)
    headers = [(b"host", b"127.0.0.1")]
    if "sessionid" in auth:
        headers.append((b"cookie", f"sessionid={auth['sessionid']}".encode()))
    if "Authorization" in auth:
        headers.append((b"authorization", auth["Authorization"].encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": url.path, "raw_path": url.path.encode(), "query_string": url.query.encode(),
        "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    sent: list[dict] = []
    requested = False

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Future()  # the client stays connected: cancelled once the response is out

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"]


async def _measure(path: str, auth: dict, repeat: int) -> dict[str, tuple[list[float], list[float]]]:
    """Milliseconds of each request, and this process's CPU milliseconds in each (every thread; not the
    database server's), through the product's ASGI application and through one with Django's own ASGI
    handler, taking turns: ``{"product" | "django": (times, cpu)}``. ``auth``: a session cookie or a token
    (``{"sessionid": ...}`` or ``{"Authorization": ...}``)."""
    from channels.routing import ProtocolTypeRouter
    from django.core.handlers.asgi import ASGIHandler

    from webapp.asgi import application

    apps = {"product": application, "django": ProtocolTypeRouter({"http": ASGIHandler()})}
    measured: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in apps}
    for app in apps.values():
        status = await _get(app, path, auth)  # warm: templates, the pool's connection
        assert status == 200, (path, status)
    for _ in range(repeat):
        for name, app in apps.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            await _get(app, path, auth)
            measured[name][0].append((time.perf_counter() - started) * 1000)
            measured[name][1].append((time.process_time() - started_cpu) * 1000)
    return measured


def _client(auth: dict):
    """Django's test client with ``auth`` (it runs a request in this thread, where its queries are seen)."""
    from django.test import Client

    client = Client(headers={k: v for k, v in auth.items() if k != "sessionid"})
    if "sessionid" in auth:
        client.cookies["sessionid"] = auth["sessionid"]
    return client


def _queries(path: str, auth: dict) -> int:
    """The database queries of one request."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = _client(auth)
    with CaptureQueriesContext(connection) as captured:
        client.get(path)
    return len(captured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--steps", type=int, default=60, help="training steps the run has written")
    parser.add_argument("--bank", type=int, default=5000, help="entries in the run's bank")
    parser.add_argument("--profile", help="a path of PAGES or API (as written there) to profile")
    args = parser.parse_args()
    logging.getLogger("axes").setLevel(logging.WARNING)  # a line per user logged in

    from django.conf import settings

    settings.STORAGES = settings.STORAGES | {
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
    }
    with throwaway_database("bench_request_cost"):
        settings.DEBUG = False
        run_id, people = _fill(args.users, args.steps, args.bank)
        who = people[1]  # not the owner: the run is shared with them
        cookie = {"sessionid": who["cookie"]}
        bearer = {"Authorization": f"Bearer {who['token']}"}
        paths = [(p, cookie) for p in PAGES] + [(p, bearer) for p in API]
        if args.profile:
            _profile(
                args.profile.format(run=run_id), cookie if args.profile in PAGES else bearer, args.repeat
            )
            return
        size = f"{args.users} users, a run of {args.steps} steps, a bank of {args.bank}"
        print(f"{size}; {args.repeat} requests each through the product's ASGI handler and Django's, in turn")
        total = {"product": [0.0, 0.0], "django": [0.0, 0.0]}
        rows = []
        for path, auth in paths:
            url = path.format(run=run_id)
            measured = asyncio.run(_measure(url, auth, args.repeat))
            line, row = f"  {path:28s}", {"request": path}
            for name, (times, cpu) in measured.items():
                wall, used = statistics.median(times), statistics.median(cpu)
                total[name][0] += wall
                total[name][1] += used
                line += f"  {name} {wall:5.1f} ms (CPU {used:5.1f})"
                row |= {f"{name} ms": round(wall, 1), f"{name} CPU ms": round(used, 1)}
            row["queries"] = _queries(url, auth)
            rows.append(row)
            print(f"{line}  {row['queries']:3d} queries")
        n = len(paths)
        mean = {"request": "mean of the medians"}
        for name, (wall, used) in total.items():
            print(f"mean of the medians, {name}: {wall / n:.1f} ms per request, CPU {used / n:.1f} ms")
            mean |= {f"{name} ms": round(wall / n, 1), f"{name} CPU ms": round(used / n, 1)}
        write_output("request-cost", {"database": size, "repeat": args.repeat, "rows": [*rows, mean]})


def _profile(path: str, auth: dict, repeat: int) -> None:
    """Where the requests of ``path`` spend their time: functions by their own time (pyinstrument)."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        sys.exit("--profile needs pyinstrument (pip install pyinstrument)")
    client = _client(auth)
    client.get(path)
    profiler = Profiler()  # in this thread: the test client runs the view here
    profiler.start()
    for _ in range(repeat):
        client.get(path)
    profiler.stop()
    print(profiler.output_text(unicode=True, flat=True, processor_options={"filter_threshold": 0.005}))


if __name__ == "__main__":
    main()

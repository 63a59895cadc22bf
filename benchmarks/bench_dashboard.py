"""Server time of the run page for a run with many metric rows (target: under 300 ms at 100k rows).

    python benchmarks/bench_dashboard.py [--rows 100000] [--repeat 7]

Runs against the real PostgreSQL (embedded by default) in a throwaway database of its own, through
Django's test client (the whole request: middleware, session, queries, template), and prints the
median and the worst of ``--repeat`` page loads, plus the time of the downsampling query alone.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

KEYS = [
    "success", "success_guided", "success_free", "reward", "reward_guided", "reward_free", "actor_loss",
    "actor_clip_frac", "extractor_loss", "extractor_clip_frac", "bank_size", "ops_add", "ops_update",
    "ops_return", "parse_failures", "retrieval_latency_ms", "time_rollout_s", "time_actor_update_s",
    "time_sync_s", "time_step_s",
]  # fmt: skip


def _insert_rows(run, rows: int) -> None:
    from django.db import connection

    from webapp.models import MetricRow

    rng = random.Random(0)
    t0 = time.perf_counter()
    for start in range(0, rows, 5000):
        MetricRow.objects.bulk_create(
            MetricRow(run=run, step=s, wall_time=s * 1.5, values={k: rng.random() for k in KEYS})
            for s in range(start, min(rows, start + 5000))
        )
    eval_values = {"success_with": 0.5, "success_without": 0.4}
    evals = [
        MetricRow(run=run, step=s, kind="eval", wall_time=s * 1.5, values=eval_values)
        for s in range(0, rows, 10)
    ]
    MetricRow.objects.bulk_create(evals)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE webapp_metricrow")
    took = time.perf_counter() - t0
    print(f"inserted {rows} train rows x {len(KEYS)} metrics + {len(evals)} eval rows in {took:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--keepdb", action="store_true", help="keep the database (and its rows) for the next run"
    )
    args = parser.parse_args()

    import django
    from django.conf import settings

    from webapp import embedded

    embedded.start_all()
    settings.DATABASES["default"]["TEST"] = {"NAME": "bench_studio_dashboard"}
    settings.STORAGES = settings.STORAGES | {
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
    }
    django.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=args.keepdb)
    try:
        from django.contrib.auth.models import User

        from trainer.config import get_preset
        from webapp.models import Run
        from webapp.selectors import run_metrics

        user, _ = User.objects.get_or_create(username="bench")
        run = Run.objects.filter(name="big", metrics__kind="train").distinct().first()
        if run is None or run.metrics.filter(kind="train").count() != args.rows:
            Run.objects.all().delete()
            run = Run.objects.create(
                name="big", owner=user, config=get_preset("cpu").to_dict(), status="running"
            )
            _insert_rows(run, args.rows)
        client = Client()
        client.force_login(user)
        url = reverse("run_detail", args=[run.id])
        client.get(url)  # warm: connections, template loading
        page_ms, query_ms = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            response = client.get(url)
            page_ms.append((time.perf_counter() - t) * 1000)
            assert response.status_code == 200
            t = time.perf_counter()
            data = run_metrics(run)
            query_ms.append((time.perf_counter() - t) * 1000)
        train = data["series"]["train"]
        kib = len(response.content) / 1024
        points, bucket = len(train["step"]), train["bucket"]
        print(f"run page, {args.rows} rows -> {points} points per series (bucket {bucket}), {kib:.0f} KiB")
        median, worst = statistics.median(page_ms), max(page_ms)
        print(f"server time: median {median:.0f} ms, max {worst:.0f} ms (target < 300 ms)")
        print(f"downsampling queries alone: median {statistics.median(query_ms):.0f} ms")
    finally:
        if not args.keepdb:
            connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()

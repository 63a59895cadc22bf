"""Prometheus metrics for operators at ``/metrics``: django-prometheus' (requests, database calls) and the
studio's own gauges, computed at each scrape (``StudioCollector``).

Readable by staff users, and by a scraper sending ``Authorization: Bearer <STUDIO_METRICS_TOKEN>``; anyone
else gets 401 (no or a wrong token, not logged in) or 403 (logged in, not staff), never a login page.

A scrape reaches one web-server process of several (``STUDIO_WEB_PROCESSES``), whose own counters would jump
back and forth between scrapes. So ``manage.py up`` gives the web server a folder in
``PROMETHEUS_MULTIPROC_DIR``, where prometheus_client keeps every process's counters and histograms, and a
scrape adds them up (its multiprocess mode; the per-process ``process_*`` metrics are then left out).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError, connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_GET
from kombu.transport.redis import PRIORITY_STEPS, Channel
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from webapp import sockets
from webapp.models import Run

log = logging.getLogger(__name__)
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def db_pool() -> Iterator[GaugeMetricFamily]:
    """This process's database pool (``OPTIONS["pool"]``); nothing without one. Each web-server process
    has its own: the scrape that serves this counts its own connection as in use."""
    if connection.pool is None:
        return
    stats = connection.pool.get_stats()
    in_use = GaugeMetricFamily(
        "studio_db_pool_connections", "Connections of this process's database pool", labels=["state"]
    )
    in_use.add_metric(["in_use"], stats["pool_size"] - stats["pool_available"])
    in_use.add_metric(["idle"], stats["pool_available"])
    yield in_use
    yield GaugeMetricFamily(
        "studio_db_pool_max_connections", "Size limit of this process's pool", stats["pool_max"]
    )
    yield GaugeMetricFamily(
        "studio_db_pool_requests_waiting",
        "Callers waiting for a pool connection",
        stats.get("requests_waiting", 0),
    )


def db_server_connections() -> Iterator[GaugeMetricFamily]:
    """Connections PostgreSQL holds to this database, from every process (web, workers, training)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(state, 'unknown'), count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() GROUP BY 1"
        )
        rows = cursor.fetchall()
    metric = GaugeMetricFamily(
        "studio_db_server_connections", "Server connections to this database, by state", labels=["state"]
    )
    for state, count in rows:
        metric.add_metric([state], count)
    yield metric


def runs_by_status() -> Iterator[GaugeMetricFamily]:
    counts = dict(Run.objects.values_list("status").annotate(n=Count("pk")).order_by())
    metric = GaugeMetricFamily("studio_runs", "Runs by status", labels=["status"])
    for status in Run.Status:
        metric.add_metric([status.value], counts.get(status.value, 0))
    yield metric


def celery_queues() -> list[str]:
    """The queues tasks are sent to: the default one and every routed one."""
    routed = (route["queue"] for route in settings.CELERY_TASK_ROUTES.values())
    return sorted({settings.CELERY_TASK_DEFAULT_QUEUE, *routed})


def queue_depths(conn: redis.Redis) -> Iterator[GaugeMetricFamily]:
    """Tasks waiting in each Celery queue (taken but unfinished ones not counted). kombu keeps a queue as a
    Redis list of its name, plus one list per priority step (``<name>\\x06\\x16<step>``)."""
    metric = GaugeMetricFamily(
        "studio_celery_queue_length", "Tasks waiting in a Celery queue", labels=["queue"]
    )
    for queue in celery_queues():
        lists = [queue] + [f"{queue}{Channel.sep}{step}" for step in PRIORITY_STEPS if step]
        metric.add_metric([queue], sum(conn.llen(name) for name in lists))
    yield metric


def open_sockets(conn: redis.Redis) -> Iterator[GaugeMetricFamily]:
    prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    yield GaugeMetricFamily(
        "studio_websockets_open",
        "Live run sockets open on every web server",
        sockets.count_open(conn, prefix),
    )


class StudioCollector(Collector):
    """The studio's gauges, read when Prometheus scrapes. One that fails (its service down) is left out of
    that scrape, with a warning, rather than failing the others."""

    GAUGES = (
        "studio_db_pool_connections", "studio_db_pool_max_connections", "studio_db_pool_requests_waiting",
        "studio_db_server_connections", "studio_runs", "studio_celery_queue_length", "studio_websockets_open",
    )  # fmt: skip

    def describe(self) -> list[GaugeMetricFamily]:
        """The gauges' names without reading them: registering (at import, maybe in an event loop) must not
        query the database, as the registry's default, calling ``collect``, would."""
        return [GaugeMetricFamily(name, "") for name in self.GAUGES]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._each((db_pool, db_server_connections, runs_by_status), DatabaseError)
        # the broker and the channel layer share the Redis at REDIS_URL (settings)
        with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5) as conn:
            parts = (lambda: queue_depths(conn), lambda: open_sockets(conn))
            yield from self._each(parts, redis.RedisError)

    def _each(self, parts, errors) -> Iterator[GaugeMetricFamily]:
        for part in parts:
            try:
                yield from list(part())  # whole or not at all
            except errors:
                log.warning("a metric could not be read", exc_info=True)


STUDIO_GAUGES = StudioCollector()
REGISTRY.register(STUDIO_GAUGES)


def scrape_registry() -> CollectorRegistry:
    """What a scrape reads: this process's registry, or with ``PROMETHEUS_MULTIPROC_DIR`` set every web
    process's counters from their files, and the studio's gauges."""
    if not os.environ.get(MULTIPROCESS_ENV):
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(STUDIO_GAUGES)
    return registry


def fresh_multiprocess_dir(path: Path) -> Path:
    """An empty folder for the web processes' metric files: counters start from zero with the server, as
    they do in one process."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def may_scrape(request: HttpRequest) -> bool:
    token = settings.STUDIO_METRICS_TOKEN
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and constant_time_compare(sent.strip(), token):
        return True
    return request.user.is_authenticated and request.user.is_active and request.user.is_staff


@login_not_required
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if may_scrape(request):
        return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
    if request.user.is_authenticated:
        return HttpResponse("Staff only.\n", status=403, content_type="text/plain")
    response = HttpResponse(
        "A staff login or the metrics token is needed.\n", status=401, content_type="text/plain"
    )
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response

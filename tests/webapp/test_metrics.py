"""/metrics: who may read it (staff, the bearer token; nobody else, and never a login page) and the studio's
own gauges, read from the real PostgreSQL and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
import redis
import redis.asyncio
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from webapp import sockets
from webapp.models import Run

pytestmark = pytest.mark.django_db
TOKEN = "a-long-random-scraper-token"


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("op", password="correct horse battery", is_staff=True)


@pytest.fixture
def metrics_token(settings):
    settings.STUDIO_METRICS_TOKEN = TOKEN


def _samples(response) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a /metrics response."""
    text = response.content.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_anonymous_gets_401_not_a_login_page(client, metrics_token):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_wrong_or_empty_token_gets_401(client, settings):
    settings.STUDIO_METRICS_TOKEN = ""  # unset: no token is accepted, not even an empty one
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401
    settings.STUDIO_METRICS_TOKEN = TOKEN
    assert client.get("/metrics", headers={"Authorization": "Bearer not-it"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": TOKEN}).status_code == 401  # no scheme


def test_a_user_who_is_not_staff_gets_403(client, user, metrics_token):
    client.force_login(user)
    assert client.get("/metrics").status_code == 403


def test_staff_may_read_the_metrics(client, staff):
    client.force_login(staff)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert "django_http_requests_total_by_method_total" in response.content.decode()  # django-prometheus'


def test_a_scraper_with_the_token_may_read_the_metrics(client, metrics_token):
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200


@pytest.fixture
def own_queues_and_sockets(settings):
    """Celery queues and a socket prefix of this test's own: the real ones belong to the running product."""
    tag = uuid.uuid4().hex[:8]
    settings.CELERY_TASK_DEFAULT_QUEUE = f"test-{tag}-default"
    settings.CELERY_TASK_ROUTES = {"webapp.tasks.train_run": {"queue": f"test-{tag}-training"}}
    layers = {"default": {**settings.CHANNEL_LAYERS["default"]}}
    layers["default"]["CONFIG"] = {**layers["default"]["CONFIG"], "prefix": f"test-{tag}"}
    settings.CHANNEL_LAYERS = layers
    conn = redis.Redis.from_url(settings.REDIS_URL)
    yield conn, tag
    for key in conn.scan_iter(match=f"test-{tag}*"):
        conn.delete(key)
    conn.close()


def test_the_gauges_count_runs_queued_tasks_open_sockets_and_connections(
    client, staff, user, own_queues_and_sockets
):
    conn, tag = own_queues_and_sockets
    for name, status in (("a", "queued"), ("b", "queued"), ("c", "running"), ("d", "failed")):
        Run.objects.create(name=name, owner=user, status=status)
    conn.rpush(f"test-{tag}-training", "task-1", "task-2")
    conn.rpush(f"test-{tag}-training\x06\x166", "a-task-sent-with-priority-6")
    conn.rpush(f"test-{tag}-default", "task-3")
    _hold_slots(f"test-{tag}", {user.pk: 2, staff.pk: 1})
    client.force_login(staff)

    samples = _samples(client.get("/metrics"))

    runs = {status: samples[("studio_runs", (("status", status),))] for status in Run.Status.values}
    assert runs == {"queued": 2, "running": 1, "succeeded": 0, "failed": 1, "cancelled": 0}
    assert samples[("studio_celery_queue_length", (("queue", f"test-{tag}-training"),))] == 3
    assert samples[("studio_celery_queue_length", (("queue", f"test-{tag}-default"),))] == 1
    assert samples[("studio_websockets_open", ())] == 3
    server = {labels: v for (name, labels), v in samples.items() if name == "studio_db_server_connections"}
    assert server[(("state", "active"),)] >= 1  # at least the scrape's own query
    if (
        connection.pool is not None
    ):  # Django's pool (OPTIONS["pool"]): the scrape holds one of its connections
        assert samples[("studio_db_pool_connections", (("state", "in_use"),))] >= 1
        assert samples[("studio_db_pool_max_connections", ())] == connection.pool.get_stats()["pool_max"]


def test_with_several_web_processes_a_scrape_adds_up_their_counters(client, staff, tmp_path, monkeypatch):
    """Each web-server process of ``manage.py up`` keeps its counters in ``PROMETHEUS_MULTIPROC_DIR``; the
    process that answers a scrape adds up every process's, and still gives the studio's gauges."""
    count = "from prometheus_client import Counter; Counter('studio_test_requests', 'x').inc({n})"
    for n in (2, 3):  # two processes
        env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
        subprocess.run([sys.executable, "-c", count.format(n=n)], env=env, check=True, timeout=60)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    client.force_login(staff)
    samples = _samples(client.get("/metrics"))
    assert samples[("studio_test_requests_total", ())] == 5
    assert ("studio_runs", (("status", "queued"),)) in samples


def test_a_lapsed_socket_slot_is_not_counted(client, staff, user, own_queues_and_sockets, settings):
    _, tag = own_queues_and_sockets
    settings.SOCKET_SLOT_TTL_S = 0.01
    _hold_slots(f"test-{tag}", {user.pk: 1})
    client.force_login(staff)
    assert _samples(client.get("/metrics"))[("studio_websockets_open", ())] == 0


def test_a_gauge_whose_service_is_down_is_left_out_not_a_failed_scrape(client, staff, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    client.force_login(staff)
    response = client.get("/metrics")
    assert response.status_code == 200
    names = {name for name, _ in _samples(response)}
    assert "studio_runs" in names and "studio_websockets_open" not in names


def _hold_slots(prefix: str, per_user: dict[int, int]) -> None:
    """Open sockets as web servers record them (``webapp.sockets``)."""
    aconn = redis.asyncio.Redis.from_url(settings.REDIS_URL)

    async def hold() -> None:
        for user_id, count in per_user.items():
            for i in range(count):
                assert await sockets.hold_slot(aconn, prefix, user_id, f"specific.test!{user_id}-{i}")
        await aconn.aclose()

    async_to_sync(hold)()

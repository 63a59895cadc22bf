"""The pages and API calls of the load benchmark (``benchmarks/bench_load.py``) read the database as many
times for a lab's worth of runs, metric rows, episodes and bank entries as for one of each: nothing is read
per row. Lists of bank entries leave the heavy columns in the database."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from api.tokens import token_create
from experience.models import Experience, SearchAsk
from webapp.models import EpisodeRecord, MetricRow, Run

pytestmark = pytest.mark.django_db

PAGES = ["/", "/runs/{run}/", "/runs/{run}/bank/", "/runs/{run}/episodes/", "/bank/", "/compare/?runs={run}"]
API = ["/api/v1/runs", "/api/v1/runs/{run}", "/api/v1/runs/{run}/metrics", "/api/v1/runs/{run}/bank"]
VECTOR = [0.0] * 383 + [1.0]


def _runs(owner, n: int, *, start: int = 0) -> list[Run]:
    """``n`` shared runs of ``owner``'s, each with ``n`` steps of metrics and episodes, ``n`` bank entries and
    ``n`` traces."""
    runs = [
        Run.objects.create(name=f"run {start + i}", owner=owner, shared=True, status="running")
        for i in range(n)
    ]
    for run in runs:
        MetricRow.objects.bulk_create(
            MetricRow(run=run, step=s, wall_time=s, values={"train/success": 0.5, "train/reward": 0.1})
            for s in range(start, start + n)
        )
        EpisodeRecord.objects.bulk_create(
            EpisodeRecord(run=run, step=s, task_instance=t, env=run.env, seed=t, guided=bool(t % 2),
                          reward=0.0, success=False, num_actions=1, turns=[{"action": "east"}])
            for s in range(start, start + n) for t in range(2)
        )  # fmt: skip
        entries = Experience.objects.bulk_create(
            Experience(run=run, title=f"hint {i}", content="take the stairs", embedding=VECTOR,
                       generation_prompt="a long extractor prompt", generation_token_ids=[1, 2, 3])
            for i in range(n)
        )  # fmt: skip
        SearchAsk.objects.bulk_create(SearchAsk(run=run, query="stairs?", experience=e) for e in entries)
    return runs


def _queries(client: Client, path: str, **headers) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, headers=headers)
    assert response.status_code == 200, (path, response.status_code)
    return [query["sql"] for query in captured]


@pytest.mark.parametrize("path", PAGES + API)
def test_a_request_reads_the_database_as_often_for_many_rows_as_for_one(client, user, other_user, path):
    watched = _runs(other_user, 1)[0]
    client.force_login(user)
    token = {"Authorization": f"Bearer {token_create(user, name='t', scope='read')[1]}"}
    headers = token if path.startswith("/api/") else {}
    url = path.format(run=watched.id)
    _queries(client, url, **headers)  # the first request of a session may write (a token's last use)
    one = _queries(client, url, **headers)
    _runs(other_user, 12, start=1)
    _runs(user, 12, start=100)
    many = _queries(client, url, **headers)
    assert len(many) == len(one), "\n".join(many)


def test_a_list_of_bank_entries_leaves_their_vectors_and_extractor_samples_in_the_database(client, user):
    run = _runs(user, 3)[0]
    client.force_login(user)
    token = {"Authorization": f"Bearer {token_create(user, name='t', scope='read')[1]}"}
    for path, headers in ((f"/runs/{run.id}/bank/", {}), (f"/api/v1/runs/{run.id}/bank", token)):
        listed = [
            sql for sql in _queries(client, path, **headers) if '"experience_experience"."title"' in sql
        ]
        assert listed, path
        for column in ("embedding", "generation_prompt", "generation_token_ids", "generation_logprobs"):
            assert all(f'"experience_experience"."{column}"' not in sql for sql in listed), (path, column)

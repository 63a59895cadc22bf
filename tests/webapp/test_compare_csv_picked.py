"""The compare CSV holds what the page shows: the picked metrics (or the page's default set), all of them on
request."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from webapp.models import MetricRow, Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(user):
    run = Run.objects.create(name="r", owner=user, method="grpo")
    for step in range(3):
        values = {"train/success": step / 2, "actor/loss": 1.0 - step / 4, "rollout/tokens_per_s": 90.0}
        MetricRow.objects.create(run=run, step=step, wall_time=10.0 * step, values=values)
    return run


def _metrics(client, query) -> set[str]:
    response = client.get(reverse("compare_csv"), query)
    assert response.status_code == 200
    return {row["metric"] for row in csv.DictReader(io.StringIO(response.content.decode()))}


def test_the_csv_holds_the_picked_metrics_only(client, user, run):
    client.force_login(user)
    assert _metrics(client, {"runs": [run.id], "metric": ["train:actor/loss"]}) == {"actor/loss"}


def test_without_a_pick_the_csv_holds_the_pages_default_set(client, user, run):
    client.force_login(user)
    page = client.get(reverse("compare"), {"runs": [run.id]}).content.decode()
    assert _metrics(client, {"runs": [run.id]}) == {"train/success"}
    assert 'value="train:train/success" checked' in page and 'value="train:actor/loss" checked' not in page


def test_all_1_exports_every_metric_and_the_page_links_to_both(client, user, run):
    client.force_login(user)
    every = _metrics(client, {"runs": [run.id], "metric": ["train:actor/loss"], "all": "1"})
    assert every == {"train/success", "actor/loss", "rollout/tokens_per_s"}
    page = client.get(reverse("compare"), {"runs": [run.id]}).content.decode()
    assert 'id="csv-link"' in page and "all=1" in page and "CSV of all 3 metrics" in page

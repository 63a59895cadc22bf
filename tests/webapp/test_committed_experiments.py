"""The grids committed under docs/experiments/ on a fresh database: listed, their pages and plots served from
their files, read-only; unknown or unsafe names are the styled 404; the 500 page needs no database."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from webapp.committed import committed_experiments
from webapp.models import Experiment
from webapp.views_errors import server_error

pytestmark = pytest.mark.django_db

COMMITTED = ["room-5x5", "room-random"]


def test_a_fresh_database_lists_the_committed_grids(client, user):
    client.force_login(user)
    assert not Experiment.objects.exists()
    page = client.get(reverse("experiments")).content.decode()
    for name in COMMITTED:
        assert f'href="/experiments/{name}/"' in page
    assert "committed results" in page and "No experiment yet" not in page


def test_a_committed_grids_page_shows_its_cells_report_and_file(client, user):
    client.force_login(user)
    response = client.get(reverse("experiment_detail", args=["room-5x5"]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "read-only" in page and "configs/experiments/room-5x5.toml" in page
    grid = next(e for e in committed_experiments() if e.name == "room-5x5")
    arms = ("complementary", "grpo")
    assert sorted((c.arm, c.seed) for c in grid.cells) == [(a, s) for a in arms for s in range(3)]
    assert all(c.status == "succeeded" and c.steps == 20 for c in grid.cells)
    assert grid.done == grid.cell_count == 6
    assert '<img src="/experiments/room-5x5/report/eval_success.png"' in page
    assert "<table>" in page  # the report's tables are rendered


def test_a_committed_grids_plot_and_files_are_served_and_nothing_else(client, user):
    client.force_login(user)
    plot = client.get(reverse("experiment_report_file", args=["room-5x5", "eval_success.png"]))
    assert plot.status_code == 200 and plot["Content-Type"] == "image/png"
    assert b"".join(plot.streaming_content).startswith(b"\x89PNG")
    csv = client.get(reverse("experiment_report_file", args=["room-random", "summary.csv"]))
    assert csv.status_code == 200
    for name, filename in [("room-5x5", "config.json"), ("room-5x5", "..png"), ("README", "report.md")]:
        response = client.get(reverse("experiment_report_file", args=[name, filename]))
        assert response.status_code == 404, (name, filename)
    assert client.get("/experiments/room-5x5/report/%2e%2e%2fREADME.md").status_code == 404


def test_a_database_experiment_of_the_folder_replaces_the_committed_row(client, user):
    Experiment.objects.create(name="room-5x5", owner=user, spec={"methods": ["grpo"], "seeds": [0]})
    client.force_login(user)
    page = client.get(reverse("experiments")).content.decode()
    assert page.count('href="/experiments/room-5x5/') == 1 and "?owner=alice" in page
    assert "read-only" not in client.get(reverse("experiment_detail", args=["room-5x5"])).content.decode()


def test_a_missing_page_is_the_styled_404_with_a_way_back(client, user):
    client.force_login(user)
    for path in ["/experiments/no-such-grid/", "/experiments/room-5x5/?owner=nobody", "/nowhere/"]:
        response = client.get(path)
        assert response.status_code == 404, path
        page = response.content.decode()
        assert 'id="not-found"' in page and 'href="/"' in page and "studio.css" in page, path


def test_the_500_page_is_styled_and_needs_no_database():
    request = RequestFactory().get("/runs/1/")
    with CaptureQueriesContext(connection) as queries:
        response = server_error(request)
    assert response.status_code == 500 and not queries.captured_queries
    page = response.content.decode()
    assert 'id="server-error"' in page and 'href="/"' in page and "studio.css" in page

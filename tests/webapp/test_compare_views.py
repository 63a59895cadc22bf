"""Comparing runs: visibility, grouping with mean ± band, summary and eval tables, config diff, CSV."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from pathlib import Path

import pytest
from django.urls import reverse

from trainer.config import get_preset
from trainer.experiments.stats import t_interval
from webapp.models import MetricRow, Run

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


def _run(owner, name, seed, method="grpo", success=(0.0, 0.5, 1.0), **fields) -> Run:
    cfg = get_preset("cpu").with_overrides(seed=seed, method=method)
    run = Run.objects.create(name=name, owner=owner, config=cfg.to_dict(), seed=seed, method=method, **fields)
    for step, value in enumerate(success):
        MetricRow.objects.create(
            run=run,
            step=step,
            wall_time=10.0 * step,
            values={"train/success": value, "actor/loss": 1 - value},
        )
    MetricRow.objects.create(
        run=run, step=2, kind="eval", wall_time=30,
        values={"eval/with_exp/success": success[-1], "eval/success": success[-1] / 2,
                "eval/with_exp/WebShop-synth/success": 0.4, "eval/WebShop-synth/success": 0.2,
                "eval/with_exp/actions": 7.0, "eval/actions": 9.0},
    )  # fmt: skip
    return run


def _chart_data(page: str) -> dict:
    return json.loads(
        page.split('<script id="compare-data" type="application/json">')[1].split("</script>")[0]
    )


def test_two_runs_overlay_with_summary_eval_table_and_config_diff(client, user, other_user):
    a = _run(user, "grpo s0", 0)
    b = _run(other_user, "comp s1", 1, method="complementary", success=(0.2, 0.4, 0.9), shared=True)
    client.force_login(user)
    response = client.get(reverse("compare"), {"runs": [a.id, b.id], "x": "wall", "smooth": "0.3"})
    page = response.content.decode()
    assert response.status_code == 200
    data = _chart_data(page)
    assert [r["id"] for r in data["runs"]] == [a.id, b.id] and data["runs"][0]["colour"] != data["runs"][1][
        "colour"
    ]
    assert data["runs"][1]["series"]["train"]["values"]["train/success"] == [0.2, 0.4, 0.9]
    picker = [(m["kind"], m["key"], m["selected"]) for m in data["metrics"]]
    assert ("train", "train/success", True) in picker and ("train", "actor/loss", False) in picker
    assert data["groups"] == [] and 'value="train:actor/loss">' in page  # unchecked in the picker
    picked = client.get(reverse("compare"), {"runs": [a.id], "metric": ["train:actor/loss", "eval:nope"]})
    chosen = {m["key"] for m in _chart_data(picked.content.decode())["metrics"] if m["selected"]}
    assert chosen == {"actor/loss"}  # the picked metric the runs have; an unknown one is left out
    summary = page[page.index('id="summary"') :]
    assert "<td>0.9 / 0.9</td>" in summary  # final / best success of b
    assert "<td>0.1 / 0.1</td>" in summary  # actor/loss: lower is better
    table = page[page.index('id="eval-table"') : page.index('id="summary"')]
    assert "WebShop-synth" in table and "average success" in table and "<td>0.4</td><td>0.2</td>" in table
    assert "<td>0.9</td><td>0.45</td><td>7</td><td>9</td>" in table  # b: average success, mean actions
    diff = page[page.index('id="config-diff"') :]
    assert "<th>method</th>" in diff and "<th>seed</th>" in diff and "actor.lr" not in diff


def test_seeds_are_grouped_into_mean_and_band(client, user):
    r0 = _run(user, "g s0", 0, success=(0.0, 0.5, 1.0))
    r1 = _run(user, "g s1", 1, success=(0.5, 0.5, 0.5))
    r2 = _run(user, "c s0", 0, method="complementary")
    client.force_login(user)
    data = _chart_data(
        client.get(reverse("compare"), {"runs": [r0.id, r1.id, r2.id], "group": "seeds"}).content.decode()
    )
    labels = [g["label"] for g in data["groups"]]
    assert labels == ["method=grpo", "method=complementary"]
    grpo = data["groups"][0]
    assert grpo["runs"] == [r0.id, r1.id]
    band = grpo["series"]["train"]["train/success"]
    assert band["step"] == [0, 1, 2] and band["mean"] == [0.25, 0.5, 0.75]
    seeds = [t_interval([0.0, 0.5]), t_interval([0.5, 0.5]), t_interval([1.0, 0.5])]  # 95% over 2 seeds
    assert band["lo"] == pytest.approx([b.low for b in seeds]) and band["lo"][1] == 0.5
    assert band["hi"] == pytest.approx([b.high for b in seeds]) and band["hi"][0] > 3  # t(1) = 12.7
    assert data["runs"][0]["colour"] == data["runs"][1]["colour"] != data["runs"][2]["colour"]
    by_key = _chart_data(
        client.get(reverse("compare"), {"runs": [r0.id, r2.id], "group": "method"}).content.decode()
    )
    assert [g["label"] for g in by_key["groups"]] == ["method=grpo", "method=complementary"]


def test_the_csv_holds_the_plotted_points(client, user):
    a = _run(user, "a, with comma", 0)
    client.force_login(user)
    response = client.get(reverse("compare_csv"), {"runs": [a.id]})
    assert response["Content-Type"] == "text/csv" and "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    success = [r for r in rows if r["metric"] == "train/success" and r["kind"] == "train"]
    assert [(r["step"], r["wall_time"], r["value"]) for r in success] == [
        ("0", "0.0", "0.0"),
        ("1", "10.0", "0.5"),
        ("2", "20.0", "1.0"),
    ]
    assert success[0]["run_name"] == "a, with comma"


def test_other_users_private_runs_are_left_out_and_bad_selections_are_refused(client, user, other_user):
    mine = _run(user, "mine", 0)
    private = _run(other_user, "their secret", 0)
    client.force_login(user)
    page = client.get(reverse("compare"), {"runs": [mine.id, private.id]}).content.decode()
    assert "their secret" not in page and [r["id"] for r in _chart_data(page)["runs"]] == [mine.id]
    response = client.get(reverse("compare"), {"runs": [private.id]}, follow=True)
    assert "none of these runs" in response.content.decode()
    assert "select at least one run" in client.get(reverse("compare"), follow=True).content.decode()
    assert "whole numbers" in client.get(reverse("compare"), {"runs": "x"}, follow=True).content.decode()
    assert client.get(reverse("compare_csv"), {"runs": [private.id]}).status_code == 400


def test_a_run_goes_beside_the_committed_grpo_seeds_in_one_click_and_they_read_as_committed(client, user):
    mine = _run(user, "mine", 0, env="MiniHack-Room-Random-5x5")
    client.force_login(user)
    page = client.get(reverse("run_detail", args=[mine.id])).content.decode()
    link = re.search(r'href="(/compare/\?runs=\d+[^"]*)"[^>]*>Compare with room-random: grpo × 3 seeds', page)
    assert link, "the run page offers the committed baseline of its environment"
    response = client.get(html.unescape(link.group(1)))
    assert response.status_code == 200
    data = _chart_data(response.content.decode())
    refs = [f"room-random/grpo-s{s}" for s in range(3)]
    assert [r["id"] for r in data["runs"]] == [mine.id, *refs]
    assert [r["committed"] for r in data["runs"]] == [False, True, True, True]
    committed = data["runs"][1]
    assert committed["url"] == "/experiments/room-random/#cell-grpo-s0" and committed["name"].endswith(
        "(committed)"
    )
    rows = [
        json.loads(line) for line in open(REPO / "docs/experiments/room-random/runs/grpo-s0/metrics.jsonl")
    ]
    final = [r for r in rows if r["kind"] == "eval"][-1]
    assert committed["series"]["eval"]["values"]["eval/success"][-1] == final["eval/success"]
    # seeds of one committed arm are grouped (by config; the committed cells' configs differ a little)
    assert [g["runs"] for g in data["groups"] if mine.id in g["runs"]] == [[mine.id]]
    page = response.content.decode()
    assert 'name="committed" value="room-random/grpo-s0"' in page and ">committed</span>" in page
    csv_rows = list(
        csv.reader(io.StringIO(client.get(reverse("compare_csv"), {"committed": refs[:1]}).content.decode()))
    )
    assert csv_rows[1][0] == "room-random/grpo-s0"


@pytest.mark.parametrize("ref", ["room-random/nope-s9", "../etc/passwd", "room-random", "x/y/z"])
def test_an_unknown_committed_cell_is_refused_by_name(client, user, ref):
    client.force_login(user)
    page = client.get(reverse("compare"), {"committed": [ref]}, follow=True).content.decode()
    assert "no committed cell" in page or "a committed cell is &lt;grid&gt;/&lt;cell folder&gt;" in page

"""CSV files the web app writes escape text cells a spreadsheet would run as a formula (OWASP "CSV
injection"): a leading ' makes them text; numbers, negative ones too, stay numbers."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from webapp.csv_cells import CsvWriter, csv_cell
from webapp.models import MetricRow, Run


@pytest.mark.parametrize("text", ["=1+1", "+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1", '=HYPERLINK("x")'])
def test_text_that_starts_like_a_formula_gets_a_leading_quote(text):
    assert csv_cell(text) == "'" + text


@pytest.mark.parametrize("value", ["grpo s0", "a=b", "", -0.5, 3, None, "1-2"])
def test_other_text_and_every_number_are_kept(value):
    assert csv_cell(value) == value


def test_the_writer_escapes_every_cell_of_every_row():
    out = io.StringIO()
    writer = CsvWriter(out)
    writer.writerow(["=cmd", 1])
    writer.writerows([["@x", -1.5], ["ok", "-y"]])
    assert list(csv.reader(io.StringIO(out.getvalue()))) == [["'=cmd", "1"], ["'@x", "-1.5"], ["ok", "'-y"]]


@pytest.mark.django_db
def test_compare_csv_escapes_a_run_name_that_starts_like_a_formula(client, user):
    run = Run.objects.create(name='=HYPERLINK("http://evil","x")', owner=user)
    MetricRow.objects.create(run=run, step=0, wall_time=0.0, values={"train/success": -0.25})
    client.force_login(user)
    response = client.get(reverse("compare_csv"), {"runs": [run.id]})
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[1][1] == "'" + run.name and rows[1][-1] == "-0.25"

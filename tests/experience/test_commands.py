"""``manage.py experience_bank``: the headless curation path."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from experience import services
from experience.models import Experience, ExperienceChange
from webapp.models import Run

pytestmark = pytest.mark.django_db


def call(*args: str) -> str:
    out = io.StringIO()
    call_command("experience_bank", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_export_import_prune_and_undo(run, user, embedder, tmp_path):
    heat = services.experience_add(run, "alfworld", "Heat with the microwave", "Heat X with microwave.")
    services.experience_add(run, "alfworld", "Cool with the fridge", "Cool X with fridge.")
    Experience.objects.filter(pk=heat.pk).update(retrieval_count=2)
    assert "alfworld" in call("stats", str(run.pk))

    path = tmp_path / "bank.jsonl"
    call("export", str(run.pk), "-o", str(path))
    assert len(path.read_text().splitlines()) == 2
    copy = Run.objects.create(name="copy", owner=user)
    assert "imported 2 entries" in call("import", str(copy.pk), str(path))
    assert Experience.objects.in_bank(copy.pk).count() == 2

    listing = call("prune", str(run.pk), "--never-retrieved", "--dry-run")
    assert "Cool with the fridge" in listing and "would delete 1 entries" in listing
    assert Experience.objects.in_bank(run.pk).count() == 2
    assert "deleted 1 entries" in call("prune", str(run.pk), "--never-retrieved")
    assert [e.pk for e in Experience.objects.in_bank(run.pk)] == [heat.pk]

    deletion = ExperienceChange.objects.filter(run=run, kind="delete").get()
    call("undo", str(deletion.pk))
    assert Experience.objects.in_bank(run.pk).count() == 2
    with pytest.raises(CommandError, match="already undone"):
        call("undo", str(deletion.pk))
    with pytest.raises(CommandError, match="no run"):
        call("stats", "999999")

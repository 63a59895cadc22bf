"""Figures that agree with the data behind them: the bank size on the run page and the bank page, an import's
bytes, the steps of an entry's history; and Undo offered only where it works, refused in the user's words."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.template.defaultfilters import filesizeformat
from django.urls import reverse

from experience import bank
from experience import services as bank_services
from experience.embedding import default_embedder
from experience.models import Experience, ExperienceChange, ImportJob, Merge
from webapp.models import MetricRow, Run

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


@pytest.fixture
def editor(user):
    user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    return user


@pytest.fixture
def run(editor):
    return Run.objects.create(name="bank run", owner=editor, method="complementary", status="running", step=1)


def _add(run, title: str, embedder, step: int = 0) -> Experience:
    text = bank.entry_text(title, "content of " + title)
    return bank.add(run.pk, "MiniHack", title, "content of " + title, embedder.embed_one(text),
                    embedding_model=embedder.model_id, step=step)  # fmt: skip


def _update(entry: Experience, embedder) -> None:
    vector = embedder.embed_one("lesson v2")
    bank.update(entry.pk, "lesson v2", "new", vector, step=1, embedding_model=embedder.model_id)


def _text(page: str, element_id: str) -> str:
    return re.sub(r"\s+", " ", page.split(f'id="{element_id}"')[1].split(">", 1)[1].split("<")[0]).strip()


def test_the_run_page_and_the_bank_page_give_the_same_bank_size(client, editor, run, embedder):
    # the step's row was written before the extractor's additions from that step
    MetricRow.objects.create(run=run, step=1, wall_time=1.0, values={"bank/size": 0.0})
    entries = [_add(run, f"lesson {i}", embedder, step=1) for i in range(3)]
    bank.delete(entries[0].pk, step=1)
    client.force_login(editor)
    run_page = client.get(reverse("run_detail", args=[run.id])).content.decode()
    bank_page = client.get(reverse("bank", args=[run.id])).content.decode()
    assert _text(run_page, "run-bank-size") == "2 entries"
    assert _text(bank_page, "bank-size") == "2 entries now"
    assert bank_page.count('<tr id="entry-') == 2  # the rows it lists


def test_an_import_done_in_the_request_records_its_files_bytes(client, editor, run, embedder):
    _add(run, "exported lesson", embedder)
    client.force_login(editor)
    body = b"".join(client.get(reverse("bank_export", args=[run.id])).streaming_content)
    target = Run.objects.create(name="target", owner=editor)
    upload = SimpleUploadedFile("bank.jsonl", body, content_type="application/jsonl")
    response = client.post(reverse("bank_import", args=[target.id]), {"file": upload}, follow=True)
    page = response.content.decode()
    job = ImportJob.objects.get(run=target)
    assert job.size == len(body) > 0 and job.status == ImportJob.Status.SUCCEEDED
    line = page.split(f'id="import-job-{job.id}"')[1].split("</div>")[0]
    assert f"({filesizeformat(len(body))}," in line and "0\xa0bytes" not in line


def test_a_file_imported_without_a_size_is_measured(editor, run, embedder, tmp_path):
    _add(run, "exported lesson", embedder)
    path = tmp_path / "bank.jsonl"
    with path.open("w", encoding="utf-8") as out:
        bank_services.experience_export(run, out)
    target = Run.objects.create(name="target", owner=editor)
    with path.open("rb") as source:
        assert bank_services.experience_import(target, source) == 1
    assert ImportJob.objects.get(run=target).size == path.stat().st_size


def test_a_persons_pin_delete_and_undo_are_recorded_at_the_runs_current_step(editor, run, embedder):
    entry = _add(run, "lesson", embedder, step=0)
    _update(entry, embedder)
    Run.objects.filter(pk=run.pk).update(step=2)
    entry.refresh_from_db()
    bank_services.experience_pin(entry, True, user=editor)
    bank_services.experience_delete(Experience.objects.get(pk=entry.pk), user=editor)
    delete = ExperienceChange.objects.filter(experience=entry).latest("id")
    bank_services.experience_undo(delete, user=editor)
    steps = [(c.kind, c.step) for c in ExperienceChange.objects.filter(experience=entry).order_by("id")]
    assert steps == [("add", 0), ("update", 1), ("pin", 2), ("delete", 2), ("undo", 2)]


def test_undo_is_offered_only_on_the_latest_change_and_a_refusal_says_what_to_do(
    client, editor, run, embedder
):
    entry = _add(run, "lesson", embedder)
    _update(entry, embedder)
    add, update = ExperienceChange.objects.filter(experience=entry).order_by("id")
    client.force_login(editor)
    page = client.get(reverse("bank_entry", args=[run.id, entry.id])).content.decode()
    rows = {c.pk: page.split(f'id="change-{c.pk}"')[1].split("</tr>")[0] for c in (add, update)}
    assert "bank_undo" not in rows[add.pk] and f"/bank/changes/{add.pk}/undo/" not in rows[add.pk]
    assert "undo the newer change first" in rows[add.pk]
    assert f"/bank/changes/{update.pk}/undo/" in rows[update.pk]
    page = client.post(reverse("bank_undo", args=[run.id, add.pk]), follow=True).content.decode()
    assert "cannot be undone" in page and "undo the later changes first" in page
    assert "changed after change #" not in page and "lesson v2" in page


def test_a_merge_is_offered_for_undo_only_while_its_entries_are_as_it_left_them(
    client, editor, run, embedder
):
    entry = _add(run, "lesson", embedder)
    merge = Merge.objects.create(
        run=run, scope="MiniHack", step=1, decision="changed", inputs=[{"id": entry.id}]
    )
    vector = embedder.embed_one("merged")
    kind = ExperienceChange.Kind.MERGE_REWRITE
    bank.update(entry.pk, "merged", "both", vector, embedding_model=embedder.model_id, step=1,
                actor=ExperienceChange.Actor.MERGE, kind=kind, merge=merge)  # fmt: skip
    client.force_login(editor)
    url = reverse("bank_merges", args=[run.id])
    assert ">Undo merge</button>" in client.get(url).content.decode()
    _update(entry, embedder)  # a later change of its entry: undoing the merge would be refused
    page = client.get(url).content.decode()
    assert ">Undo merge</button>" not in page and "undo the later changes first" in page
    entry_page = client.get(reverse("bank_entry", args=[run.id, entry.id])).content.decode()
    assert entry_page.count(">Undo</button>") == 1  # the newest change only

"""Bank imports through the API, as the bank page's Import does: a small file imported within the request, a
larger one queued for a worker, watched and cancelled; nothing half-imported; the bank page's permission."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from experience import transfer
from experience.models import Experience, ImportJob
from experience.services import IMPORT_INLINE_MAX_BYTES
from tests.api.conftest import bearer, make_run

pytestmark = pytest.mark.django_db


def _lines(n: int, padding: int = 0) -> bytes:
    records = [
        {"format": transfer.FORMAT, "scope": "MiniHack", "title": f"Lesson {i}",
         "content": f"Walk around boulder {i}, then take the stairs." + " " * padding}
        for i in range(n)
    ]  # fmt: skip
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


def _post(client: Client, url: str, body: bytes, headers: dict) -> object:
    upload = SimpleUploadedFile("lessons.jsonl", body, content_type="application/jsonl")
    return client.post(url, {"file": upload}, headers=headers)


@pytest.fixture
def editor(user):
    user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    return user


def test_a_small_file_is_imported_within_the_request_and_listed(client, editor):
    run, auth = make_run(editor), bearer(editor)
    answer = _post(client, f"/api/v1/runs/{run.id}/imports", _lines(3), auth)
    assert answer.status_code == 201, answer.content
    job = answer.json()
    assert job["status"] == "succeeded" and job["entries"] == 3 and job["file_name"] == "lessons.jsonl"
    assert Experience.objects.in_bank(run.pk).count() == 3
    listed = client.get(f"/api/v1/runs/{run.id}/imports", headers=auth).json()
    assert listed["count"] == 1 and listed["items"][0]["id"] == job["id"]
    one = client.get(f"/api/v1/runs/{run.id}/imports/{job['id']}", headers=auth).json()
    assert one == job


def test_a_file_that_is_not_an_export_is_refused_with_the_line_and_imports_nothing(client, editor):
    run, auth = make_run(editor), bearer(editor)
    body = _lines(2) + b'{"format": "something else"}\n'
    answer = _post(client, f"/api/v1/runs/{run.id}/imports", body, auth)
    assert answer.status_code == 422, answer.content
    refused = answer.json()
    assert "nothing was imported" in refused["detail"] and "line 3" in refused["errors"]["file"][0]
    assert Experience.objects.filter(run=run).count() == 0
    assert ImportJob.objects.get(run=run).status == ImportJob.Status.FAILED


def test_a_large_file_is_queued_and_cancelled_through_the_api_and_nothing_of_it_remains(
    client, editor, django_capture_on_commit_callbacks
):
    run, auth = make_run(editor), bearer(editor)
    body = _lines(400, padding=600)
    assert len(body) > IMPORT_INLINE_MAX_BYTES
    with django_capture_on_commit_callbacks(execute=False) as queued:
        answer = _post(client, f"/api/v1/runs/{run.id}/imports", body, auth)
    assert answer.status_code == 202 and answer.json()["status"] == "queued", answer.content
    assert len(queued) == 1  # the task, sent once the request's transaction commits
    job = ImportJob.objects.get(pk=answer.json()["id"])
    cancel = f"/api/v1/runs/{run.id}/imports/{job.pk}/cancel"
    answer = client.post(cancel, headers=auth)
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled", answer.content
    job.refresh_from_db()
    assert job.path == "" or not Path(job.path).exists()  # the upload is removed
    again = client.post(cancel, headers=auth)
    assert again.status_code == 409 and "cancelled already" in again.json()["detail"]
    assert Experience.objects.filter(run=run).count() == 0


def test_imports_need_the_bank_pages_permission_and_a_writing_token(client, user, django_user_model):
    run = make_run(user)  # the owner, without the edit_bank permission
    url = f"/api/v1/runs/{run.id}/imports"
    assert _post(client, url, _lines(1), bearer(user)).status_code == 403
    editor = django_user_model.objects.create_user("mallory")
    editor.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    assert _post(client, url, _lines(1), bearer(editor)).status_code == 404  # not their run, not shared
    assert _post(client, url, _lines(1), {}).status_code == 401
    user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    assert _post(client, url, _lines(1), bearer(user, "read")).status_code == 403
    assert client.get(url, headers=bearer(user, "read")).status_code == 200  # reading needs no more
    assert Experience.objects.filter(run=run).count() == 0


def test_a_request_without_a_file_is_refused_after_the_permission_check(client, editor, django_user_model):
    run = make_run(editor)
    url = f"/api/v1/runs/{run.id}/imports"
    answer = client.post(url, {}, headers=bearer(editor))
    assert answer.status_code == 422 and "file" in answer.json()["errors"], answer.content
    stranger = django_user_model.objects.create_user("oscar")
    assert client.post(url, {}, headers=bearer(stranger)).status_code == 404  # not "no file"

"""A bank import is streamed (lines read one at a time, embedded and staged in batches), all or nothing,
and a large upload is imported by a task in the ``default`` queue with its progress on the bank page."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.urls import reverse

from experience import services, transfer
from experience.bank import BankError
from experience.manager import ExperienceManager
from experience.models import Experience, ExperienceChange, ImportJob, ImportRow
from experience.services import IMPORT_INLINE_MAX_BYTES
from experience.tasks import import_bank
from trainer.store import Add, MergeAction, MergePlan
from webapp.celery import app

pytestmark = pytest.mark.django_db


def _record(i: int, embedder=None) -> dict:
    record = {"format": transfer.FORMAT, "scope": "MiniHack", "title": f"Lesson {i}",
              "content": f"Walk around the boulder number {i} and then take the stairs."}  # fmt: skip
    if embedder is not None:  # an export of the same model: its vector is kept, nothing to embed
        unit = [(1 / embedder.dim) ** 0.5] * embedder.dim
        record |= {"embedding_model": embedder.model_id, "embedding": unit}
    return record


def _large_file(embedder, n: int, bad: dict[int, str] | None = None) -> bytes:
    """More than the inline limit: ``n`` lines, each carrying its vector; ``bad`` replaces lines."""
    lines = [json.dumps(_record(i, embedder)) for i in range(n)]
    for number, text in (bad or {}).items():
        lines[number - 1] = text
    body = ("\n".join(lines) + "\n").encode()
    assert len(body) > IMPORT_INLINE_MAX_BYTES
    return body


@pytest.fixture
def editor(user):
    user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    return user


def _upload(client, run, body: bytes, callbacks_fixture):
    upload = SimpleUploadedFile("big.jsonl", body, content_type="application/jsonl")
    with callbacks_fixture(execute=False) as callbacks:
        page = client.post(reverse("bank_import", args=[run.id]), {"file": upload}, follow=True)
    return page.content.decode(), callbacks


def test_read_lines_numbers_lines_skips_blanks_and_drops_an_over_long_line_without_keeping_it():
    source = io.BytesIO(b'{"a": 1}\n\n' + b"x" * 50 + b"\n" + b'{"b": 2}')
    assert list(transfer.read_lines(source, limit=20)) == [(1, b'{"a": 1}\n'), (3, None), (4, b'{"b": 2}')]


def test_a_line_longer_than_the_limit_is_refused_by_its_number(run, embedder):
    body = json.dumps(_record(1)) + "\n" + '{"format": "' + "x" * (transfer.LINE_MAX_BYTES + 10) + '"}\n'
    with pytest.raises(transfer.ImportRejected, match="line 2: longer than 2,000,000 characters"):
        services.experience_import(run, io.StringIO(body))
    assert not Experience.objects.filter(run=run).exists()


def test_a_rejected_line_quoting_a_nul_byte_fails_the_import_with_its_message_kept(run, embedder):
    bad = _record(2) | {"bad\x00key": 1}  # a valid entry but for a key the error message quotes
    body = json.dumps(_record(1)) + "\n" + json.dumps(bad) + "\n"
    with pytest.raises(transfer.ImportRejected, match="line 2"):
        services.experience_import(run, io.StringIO(body))
    job = ImportJob.objects.get(run=run)
    assert job.status == ImportJob.Status.FAILED and "line 2" in job.error and "\x00" not in job.error
    assert not Experience.objects.filter(run=run).exists()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        # pydantic's own parser kept the last of a repeated key
        (json.dumps(_record(2))[:-1] + ', "title": "again"}', "repeats the key 'title'"),
        ('{"format": NaN}', ""),  # refused by the record's own validation, naming the field
        ("[" * 100_000 + "]" * 100_000, ""),
    ],
    ids=["repeated-key", "nan", "nested-100000-deep"],
)
def test_a_line_that_is_not_strict_json_fails_the_import_by_its_number(run, embedder, line, why):
    body = json.dumps(_record(1)) + "\n" + line + "\n"
    with pytest.raises(transfer.ImportRejected, match=f"line 2: .*{why}"):
        services.experience_import(run, io.StringIO(body))
    assert not Experience.objects.filter(run=run).exists()


def test_an_import_adds_every_line_in_batches_and_leaves_no_staging_rows(run, user, embedder, monkeypatch):
    monkeypatch.setattr(transfer, "BATCH_LINES", 3)
    body = "".join(json.dumps(_record(i)) + "\n" for i in range(8))
    assert services.experience_import(run, io.StringIO(body), user=user, file_name="b.jsonl") == 8
    titles = list(Experience.objects.in_bank(run.pk).order_by("id").values_list("title", flat=True))
    assert titles == [f"Lesson {i}" for i in range(8)]
    assert ExperienceChange.objects.filter(run=run, kind="import", user=user).count() == 8
    job = ImportJob.objects.get(run=run)
    assert (job.status, job.lines, job.entries, job.file_name) == ("succeeded", 8, 8, "b.jsonl")
    assert not ImportRow.objects.exists()


def test_the_import_task_is_routed_to_the_default_queue():
    assert app.amqp.router.route({}, import_bank.name)["queue"].name == "default"


def test_a_large_upload_is_queued_after_commit_and_the_task_imports_it_with_progress_shown(
    client, editor, run, embedder, django_capture_on_commit_callbacks
):
    client.force_login(editor)
    page, callbacks = _upload(client, run, _large_file(embedder, 60), django_capture_on_commit_callbacks)
    job = ImportJob.objects.get(run=run)
    assert "in the background" in page and f'id="import-job-{job.id}"' in page
    assert "waiting for a worker" in page
    upload_path = Path(job.path)
    assert len(callbacks) == 1 and job.status == "queued" and upload_path.is_file()
    assert not Experience.objects.filter(run=run).exists()  # the request did not import

    assert import_bank(job.id) == "succeeded"
    assert import_bank(job.id) == "not claimed"  # delivered twice: imported once
    job.refresh_from_db()
    assert (job.entries, job.path) == (60, "") and not upload_path.exists()
    assert Experience.objects.in_bank(run.pk).count() == 60
    status = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
    assert "imported 60 entries" in status and "hx-trigger" not in status  # finished: polling stops


def test_a_queued_import_shows_its_progress_and_polls(client, editor, run, embedder):
    job = ImportJob.objects.create(run=run, file_name="f.jsonl", status="embedding", lines=80, done=20)
    client.force_login(editor)
    status = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
    assert "20 of 80 lines" in status and 'value="25"' in status and 'hx-trigger="every 1s"' in status


def test_a_large_upload_with_bad_lines_imports_nothing_and_the_page_names_the_lines(
    client, editor, run, embedder, django_capture_on_commit_callbacks
):
    client.force_login(editor)
    body = _large_file(embedder, 60, bad={7: "{not json", 59: json.dumps(_record(1) | {"pinned": "maybe"})})
    _upload(client, run, body, django_capture_on_commit_callbacks)
    job = ImportJob.objects.get(run=run)
    assert import_bank(job.id) == "failed"
    assert not Experience.objects.filter(run=run).exists() and not ImportRow.objects.exists()
    assert not Path(job.path).exists()
    page = client.get(reverse("bank", args=[run.id])).content.decode()
    assert "nothing was imported" in page and "2 of 60 lines" in page and "line 7:" in page
    assert "line 59: pinned" in page


def test_a_failure_while_writing_rolls_the_whole_import_back(run, embedder, monkeypatch):
    calls = []

    def fail_on_second_chunk(run_id, entries, *, user=None):
        calls.append(len(entries))
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return original(run_id, entries, user=user)

    original = transfer.bank.add_imported
    monkeypatch.setattr(transfer.bank, "add_imported", fail_on_second_chunk)
    monkeypatch.setattr(transfer, "COMMIT_CHUNK", 2)
    body = "".join(json.dumps(_record(i, embedder)) + "\n" for i in range(5))
    job = ImportJob.objects.create(run=run)
    with pytest.raises(RuntimeError):
        transfer.run_job(job, io.StringIO(body), embedder)
    job.refresh_from_db()
    assert calls == [2, 2] and job.status == "failed" and "disk full" in job.error
    assert not Experience.objects.filter(run=run).exists() and not ImportRow.objects.exists()


def test_the_page_states_the_import_limits(client, editor, run):
    client.force_login(editor)
    page = client.get(reverse("bank", args=[run.id])).content.decode()
    limits = page[page.index('id="import-limits"') :]
    assert "50 MB" in limits and "200,000 entries" in limits and "20,000" in limits


def test_an_import_cancelled_while_it_embeds_stops_at_its_next_batch_and_imports_nothing(
    run, embedder, monkeypatch
):
    monkeypatch.setattr(transfer, "BATCH_LINES", 3)
    job = ImportJob.objects.create(run=run, file_name="c.jsonl")
    embed, batches = embedder.embed, []

    def embed_then_cancel(texts, **kwargs):  # someone presses Cancel while the second batch embeds
        batches.append(len(texts))
        if len(batches) == 2:
            assert services.import_job_cancel(ImportJob.objects.get(pk=job.pk)) == "stopping"
        return embed(texts, **kwargs)

    monkeypatch.setattr(embedder, "embed", embed_then_cancel)
    body = "".join(json.dumps(_record(i)) + "\n" for i in range(9))
    assert transfer.run_job(job, io.StringIO(body), embedder) == 0
    job.refresh_from_db()
    assert job.status == "cancelled" and job.finished and batches == [3, 3]  # the third batch never embedded
    assert not Experience.objects.filter(run=run).exists() and not ImportRow.objects.exists()


def test_a_queued_import_is_cancelled_at_once_and_a_finished_one_is_refused(run, tmp_path):
    upload = tmp_path / "queued.jsonl"
    upload.write_text("{}\n")
    queued = ImportJob.objects.create(run=run, path=str(upload))
    assert services.import_job_cancel(queued) == "cancelled" and not upload.exists()
    assert ImportJob.objects.get(pk=queued.pk).status == "cancelled"
    assert services.import_job_run(queued.pk) == "not claimed"  # a late worker leaves it alone
    done = ImportJob.objects.create(run=run, status=ImportJob.Status.SUCCEEDED)
    with pytest.raises(BankError, match="has succeeded already"):
        services.import_job_cancel(done)
    writing = ImportJob.objects.create(run=run, status=ImportJob.Status.WRITING)
    with pytest.raises(BankError, match="writing its entries already"):
        services.import_job_cancel(writing)


def test_the_bank_page_offers_cancel_while_an_import_runs(client, editor, run):
    client.force_login(editor)
    job = ImportJob.objects.create(run=run, status=ImportJob.Status.EMBEDDING, lines=10, done=3)
    line = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
    assert f'id="import-cancel-{job.id}"' in line
    page = client.post(reverse("bank_import_cancel", args=[run.id, job.id]), follow=True).content.decode()
    assert "stopping: nothing of it will be imported" in page
    assert ImportJob.objects.get(pk=job.pk).cancel_requested
    line = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
    assert "stopping…" in line and "import-cancel" not in line


def _hold_staging_rows(job: ImportJob, held: threading.Event, release: threading.Event) -> None:
    """Row-lock the job's staging rows in another connection, so the import's commit waits at their
    removal: after it has inserted every entry, before it ends."""
    try:
        with transaction.atomic():
            list(ImportRow.objects.select_for_update().filter(job=job))
            held.set()
            release.wait(60)
    finally:
        connection.close()


def _wait_for_a_lock_wait(seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.05)
    raise AssertionError("the import never reached its end")


@pytest.mark.django_db(transaction=True)
def test_a_merge_applies_while_an_import_writes_its_entries_and_both_keep_everything(run, user, embedder):
    with ExperienceManager(run.pk, embedder=embedder) as manager:
        old = [
            r.entry_id
            for r in manager.apply(
                [Add("MiniHack", f"Old {i}", f"Old lesson {i}.") for i in range(2)], step=0
            )
        ]
        job = ImportJob.objects.create(run=run, user=user)
        body = "".join(json.dumps(_record(i, embedder)) + "\n" for i in range(6))
        transfer.stage(job, io.StringIO(body), embedder)
        held, release, imported = threading.Event(), threading.Event(), []
        holder = threading.Thread(target=_hold_staging_rows, args=(job, held, release))
        holder.start()
        assert held.wait(30)

        def importing() -> None:
            try:
                imported.append(transfer.commit(job, embedder))
            finally:
                connection.close()

        importer = threading.Thread(target=importing)
        importer.start()
        try:
            _wait_for_a_lock_wait()  # the import has inserted its entries and waits, uncommitted
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '5s'")  # waiting for the import's end would fail here
            merged = MergePlan((MergeAction("merge", tuple(old), "Old, merged", "Both old lessons."),))
            report = manager.merge("MiniHack", lambda chunk: merged, step=1)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
            release.set()
            holder.join(30)
            importer.join(60)
    assert (report.removed, report.created, report.stale) == (2, 1, 0)
    assert imported == [6]
    titles = sorted(Experience.objects.in_bank(run.pk).values_list("title", flat=True))
    assert titles == sorted(["Old, merged"] + [f"Lesson {i}" for i in range(6)])
    assert ExperienceChange.objects.filter(run=run, kind="import").count() == 6


@pytest.mark.parametrize("nice, idle", [(19, False), (15, True)], ids=["share (default)", "SCHED_IDLE"])
def test_a_queued_import_embeds_below_a_training_run_and_the_worker_keeps_its_priority(
    run, user, embedder, monkeypatch, tmp_path, settings, nice, idle
):
    def priority() -> tuple[int, int]:
        tid = threading.get_native_id()
        return os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)

    seen, embed = [], embedder.embed

    def recording(texts, **options):
        seen.append(priority())
        return embed(texts, **options)

    monkeypatch.setattr(embedder, "embed", recording)
    settings.STUDIO_IMPORT_NICE, settings.STUDIO_IMPORT_IDLE = nice, idle
    before = priority()
    path = tmp_path / "queued.jsonl"
    path.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(5)))
    job = ImportJob.objects.create(run=run, user=user, path=str(path), file_name="queued.jsonl")
    assert import_bank(job.id) == "succeeded"
    assert Experience.objects.in_bank(run.pk).count() == 5
    # below a training process (+10); under SCHED_IDLE only when nothing else wants the core
    assert seen and set(seen) == {(max(nice, before[0]), os.SCHED_IDLE if idle else os.SCHED_OTHER)}
    assert priority() == before


@pytest.mark.django_db(transaction=True)
def test_a_queued_import_waiting_for_a_core_stays_alive_and_stops_when_cancelled(
    run, user, embedder, monkeypatch, tmp_path, settings
):
    """A batch at SCHED_IDLE may wait long beside a busy run: the job keeps saying it is alive (no takeover
    as silent), and a cancel asked for meanwhile ends it without waiting for the batch."""
    settings.STUDIO_IMPORT_HEARTBEAT_S = 0.05
    path = tmp_path / "queued.jsonl"
    path.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(5)))
    job = ImportJob.objects.create(run=run, user=user, path=str(path), file_name="queued.jsonl")
    beats, embed, release = [], embedder.embed, threading.Event()

    def starved(texts, **options):  # a batch that gets no core until the test releases it
        ImportJob.objects.filter(pk=job.pk).update(updated_at=job.created_at)  # silent, as seen from outside
        beats.append(ImportJob.objects.get(pk=job.pk).updated_at)
        ImportJob.objects.filter(pk=job.pk).update(cancel_requested=True)
        connection.close()
        release.wait(30)
        return embed(texts[:0], **options)  # dropped by the import: no encode (it would wait for a core)

    monkeypatch.setattr(embedder, "embed", starved)
    began = time.monotonic()
    try:
        assert import_bank(job.id) == "cancelled"
        assert time.monotonic() - began < 15  # not after the batch (it waits 30 s for a core here)
    finally:
        release.set()
    job.refresh_from_db()
    assert job.updated_at > beats[0]  # the wait said it was alive
    assert not Experience.objects.filter(run=run).exists() and not ImportRow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_import_sharing_the_cpu_with_busy_work_says_so_on_its_page_and_in_the_api(
    run, editor, embedder, tmp_path, settings, client
):
    """Beside work that keeps the cores busy (here: another forward pass holds the model for 1 s) a queued
    import gives way, pausing for its share (STUDIO_IMPORT_SHARE); meanwhile the bank page and the API say
    so, and the import still finishes with every line."""
    settings.STUDIO_IMPORT_IDLE, settings.STUDIO_IMPORT_SHARE = False, 0.5
    settings.STUDIO_IMPORT_NICE, settings.STUDIO_IMPORT_HEARTBEAT_S = 0, 0.1
    client.force_login(editor)
    path = tmp_path / "queued.jsonl"
    path.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(5)))
    job = ImportJob.objects.create(run=run, user=editor, path=str(path), file_name="queued.jsonl")
    held, outcome = threading.Event(), []

    def busy() -> None:
        with embedder._encode_lock:
            held.set()
            time.sleep(1.0)

    def importing() -> None:
        try:
            outcome.append(import_bank(job.id))
        finally:
            connection.close()

    threads = [threading.Thread(target=busy), threading.Thread(target=importing)]
    threads[0].start()
    held.wait(10)
    threads[1].start()
    page_lines, api_since = [], []
    while threads[1].is_alive():
        page = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
        if "sharing the CPU" in page:
            page_lines.append(page)
            api_since.append(client.get(f"/api/v1/runs/{run.id}/imports/{job.id}").json()["giving_way_since"])
        time.sleep(0.1)
    for t in threads:
        t.join(30)
    assert outcome == ["succeeded"]
    assert Experience.objects.in_bank(run.pk).count() == 5
    assert page_lines and "it embeds at most 50% of the time" in page_lines[0]
    assert any(api_since)
    after = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
    assert "sharing the CPU" not in after and "imported 5 entries" in after

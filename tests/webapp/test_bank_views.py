"""Experience bank pages as editor, viewer, other user and anonymous: search, entry page with history and
undo, edit, pin, delete, prune with preview, merge history, JSONL export and import. Real embeddings."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from experience import bank
from experience.embedding import default_embedder
from experience.models import Experience, ExperienceChange, ImportJob
from webapp import views_bank
from webapp.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="session")
def embedder():
    return default_embedder()


@pytest.fixture
def editor(user):
    user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    return user


@pytest.fixture
def run(editor):
    return Run.objects.create(name="bank run", owner=editor, method="complementary")


def _add(run, title, content, embedder, **counters) -> Experience:
    entry = bank.add(
        run.pk,
        "MiniHack",
        title,
        content,
        embedder.embed_one(bank.entry_text(title, content)),
        embedding_model=embedder.model_id,
        step=counters.pop("step", 0),
    )
    if counters:
        Experience.objects.filter(pk=entry.pk).update(**counters)
        entry.refresh_from_db()
    return entry


@pytest.fixture
def entries(run, embedder):
    return [
        _add(
            run,
            "Open doors with keys",
            "If a door is locked, pick up the key first, then open the door.",
            embedder,
            retrieval_count=5,
            guided_successes=4,
            guided_failures=1,
            step=3,
        ),
        _add(
            run,
            "Avoid the monster",
            "When a monster is adjacent, step away before moving to the stairs.",
            embedder,
            retrieval_count=0,
            step=1,
        ),
        _add(
            run,
            "Buy cheap shoes <b>",
            "Search for the product, click the cheapest matching item, then buy.",
            embedder,
            retrieval_count=2,
            guided_successes=0,
            guided_failures=2,
            step=8,
        ),
    ]


def test_anonymous_users_are_sent_to_login_from_every_bank_page(client, run, entries):
    e = entries[0]
    for url in [
        reverse("bank", args=[run.id]),
        reverse("bank_entry", args=[run.id, e.id]),
        reverse("bank_merges", args=[run.id]),
        reverse("bank_export", args=[run.id]),
        reverse("bank_prune", args=[run.id]) + "?never_retrieved=on",
    ]:
        assert client.get(url)["Location"].startswith(reverse("login")), url
    for url in [reverse("bank_pin", args=[run.id, e.id]), reverse("bank_delete", args=[run.id, e.id])]:
        assert client.post(url, {"pinned": "1"})["Location"].startswith(reverse("login"))
    assert Experience.objects.filter(pinned=True).count() == 0 and Experience.objects.live().count() == 3


def test_the_bank_lists_sorts_and_searches_by_meaning_and_text(client, editor, run, entries):
    client.force_login(editor)
    url = reverse("bank", args=[run.id])
    page = client.get(url).content.decode()
    assert "Open doors with keys" in page and "Buy cheap shoes &lt;b&gt;" in page and "<b>" not in page
    usage = client.get(url, {"sort": "usage"}).content.decode()
    assert usage.index("Open doors") < usage.index("Buy cheap") < usage.index("Avoid the monster")
    success = client.get(url, {"sort": "success"}).content.decode()
    assert success.index("Open doors") < success.index("Buy cheap") < success.index("Avoid the monster")
    text = client.get(url, {"q": "monster", "mode": "text"}).content.decode()
    assert "Avoid the monster" in text and "Open doors" not in text


def test_search_by_meaning_lists_only_entries_above_its_stated_cut_off(client, editor, run, entries):
    """Similarities to this query: Open doors 0.71, Avoid the monster 0.23, Buy cheap shoes 0.07."""
    client.force_login(editor)
    semantic = client.get(
        reverse("bank", args=[run.id]),
        {"q": "the door is locked, how do I get through", "mode": "semantic"},
        headers={"HX-Request": "true", "HX-Target": "bank-list"},
    ).content.decode()
    assert semantic.startswith('<div id="bank-list">') and "Open doors with keys" in semantic
    assert "Avoid the monster" not in semantic and "Buy cheap shoes" not in semantic
    assert "similarity of at least 0.30 to the query, closest first, at most 100" in semantic


def test_search_by_meaning_says_when_nothing_in_the_bank_is_close(client, editor, run, entries):
    client.force_login(editor)
    query = {"q": "a good chocolate cake recipe", "mode": "semantic"}
    page = client.get(reverse("bank", args=[run.id]), query).content.decode()
    listed = page[page.index('id="bank-list"') :]
    assert "Nothing is close in meaning to “a good chocolate cake recipe”" in listed
    assert not any(title in listed for title in ("Open doors", "Avoid the monster", "Buy cheap"))
    across = client.get(reverse("banks"), query).content.decode()
    results = across[across.index('id="search-results"') : across.index('id="bank-runs"')]
    assert "Nothing is close in meaning" in results and "Open doors" not in results


def test_an_editor_edits_pins_deletes_and_undoes_and_each_change_is_recorded_as_a_persons(
    client, editor, run, entries
):
    e = entries[1]
    client.force_login(editor)
    url = reverse("bank_entry", args=[run.id, e.id])
    response = client.post(
        url, {"title": "Keep away from monsters", "content": "Step away first.", "version": e.version}
    )
    assert response.status_code == 302
    e.refresh_from_db()
    assert (e.title, e.content, e.version) == ("Keep away from monsters", "Step away first.", 2)
    row = client.post(
        reverse("bank_pin", args=[run.id, e.id]),
        {"pinned": "1"},
        headers={"HX-Request": "true", "HX-Target": f"entry-{e.id}"},
    ).content.decode()
    assert row.startswith(f'<tr id="entry-{e.id}">') and "pinned" in row and "Unpin" in row
    assert Experience.objects.get(pk=e.id).pinned
    client.post(reverse("bank_delete", args=[run.id, e.id]))
    assert Experience.objects.get(pk=e.id).is_deleted
    changes = list(ExperienceChange.objects.filter(experience=e).order_by("id"))
    assert [c.kind for c in changes] == ["add", "update", "pin", "delete"]
    assert all(c.actor == "person" and c.user == editor for c in changes[1:])
    page = client.get(url).content.decode()
    assert "deleted" in page and page.count(">Undo</button>") == 1  # only the newest change can be undone
    history = page[page.index('id="history"') :]
    # who changed what, as a diff: the edit's words removed and added, the pin and the delete as flags
    assert "<del>Avoid the monster</del><ins>Keep away from monsters</ins>" in history.replace(
        " <ins>", "<ins>"
    )
    assert "<del>When a monster is adjacent, step</del> <ins>Step</ins> away <del>before moving" in history
    assert "pinned: False → True" in history
    assert "deleted: False → True" in history
    assert f"<td>{editor.username}</td>" in history and "Person" not in history
    client.post(reverse("bank_undo", args=[run.id, changes[-1].id]))
    assert not Experience.objects.get(pk=e.id).is_deleted
    page = client.post(reverse("bank_undo", args=[run.id, changes[-1].id]), follow=True).content.decode()
    assert "already undone" in page


def test_bad_edits_are_refused_with_a_message_and_change_nothing(client, editor, run, entries):
    e = entries[0]
    client.force_login(editor)
    response = client.post(reverse("bank_entry", args=[run.id, e.id]), {"title": "", "content": "x"})
    assert response.status_code == 400 and 'id="error-title"' in response.content.decode()
    e.refresh_from_db()
    assert e.title == "Open doors with keys" and e.version == 1


def test_viewers_of_a_shared_run_can_read_but_not_edit_and_private_banks_are_hidden(
    client, other_user, run, entries
):
    other_user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    e = entries[0]
    client.force_login(other_user)
    assert client.get(reverse("bank", args=[run.id])).status_code == 404
    assert client.get(reverse("bank_entry", args=[run.id, e.id])).status_code == 404
    assert client.post(reverse("bank_pin", args=[run.id, e.id]), {"pinned": "1"}).status_code == 404
    Run.objects.filter(pk=run.pk).update(shared=True)
    page = client.get(reverse("bank_entry", args=[run.id, e.id])).content.decode()
    assert "Open doors with keys" in page and "Save" not in page and "Delete" not in page
    assert client.post(reverse("bank_pin", args=[run.id, e.id]), {"pinned": "1"}).status_code == 403
    assert (
        client.post(reverse("bank_entry", args=[run.id, e.id]), {"title": "x", "content": "y"}).status_code
        == 403
    )
    assert client.post(reverse("bank_delete", args=[run.id, e.id])).status_code == 403
    assert client.get(reverse("bank_prune", args=[run.id]), {"never_retrieved": "on"}).status_code == 403
    assert (
        not Experience.objects.get(pk=e.id).pinned
        and Experience.objects.get(pk=e.id).title == "Open doors with keys"
    )


def test_the_owner_without_the_permission_cannot_edit(client, django_user_model, embedder):
    owner = django_user_model.objects.create_user("carol", password="correct horse battery")
    run = Run.objects.create(name="r", owner=owner)
    e = _add(run, "t", "c", embedder)
    client.force_login(owner)
    assert client.post(reverse("bank_pin", args=[run.id, e.id]), {"pinned": "1"}).status_code == 403


def test_prune_shows_a_preview_then_deletes_exactly_that_on_confirmation(client, editor, run, entries):
    client.force_login(editor)
    Experience.objects.filter(pk=entries[1].pk).update(pinned=True)  # never retrieved, but pinned: kept
    url = reverse("bank_prune", args=[run.id])
    rule = {"never_retrieved": "on", "success_rate_below": "0.5", "min_guided": "2", "combine": "any"}
    page = client.get(url, rule).content.decode()
    assert (
        "1 entry would be deleted" in page and "Buy cheap shoes" in page and "Avoid the monster" not in page
    )
    assert "any one" in page and Experience.objects.live().count() == 3  # a preview changes nothing
    ids = re.search(r'name="ids" value="([0-9,]*)"', page).group(1)
    confirm = rule | {
        "never_retrieved": "True",
        "older_than_step": "",
        "scope": "",
        "confirm": "1",
        "ids": ids,
    }
    page = client.post(url, confirm, follow=True).content.decode()
    assert "Pruned 1 entry" in page and "Undo the last prune (1 entries)" in page
    assert set(Experience.objects.live().values_list("title", flat=True)) == {
        "Open doors with keys",
        "Avoid the monster",
    }
    page = client.post(reverse("bank_prune_undo", args=[run.id]),
                       {"batch": re.search(r'name="batch" value="([0-9a-f]+)"', page).group(1)},
                       follow=True).content.decode()  # fmt: skip
    assert "1 entry back" in page and Experience.objects.live().count() == 3


def test_prune_criteria_narrow_by_default_and_confirming_deletes_only_the_previewed_ids(
    client, editor, run, entries
):
    client.force_login(editor)
    url = reverse("bank_prune", args=[run.id])
    assert (
        "0 entries would be deleted"
        in client.get(url, {"never_retrieved": "on", "older_than_step": "1"}).content.decode()
    )  # never retrieved (entry 1) AND changed before step 1 (none): nothing
    both = {"never_retrieved": "on", "older_than_step": "2"}
    page = client.get(url, both).content.decode()
    previewed = {int(i) for i in re.search(r'name="ids" value="([0-9,]*)"', page).group(1).split(",") if i}
    assert previewed == {entries[1].pk}
    Experience.objects.filter(pk=entries[0].pk).update(retrieval_count=0, updated_step=0)  # the run moves on
    confirm = both | {"confirm": "1", "ids": ",".join(map(str, previewed)), "combine": "all"}
    client.post(url, confirm)
    gone = set(Experience.objects.filter(deleted_at__isnull=False).values_list("pk", flat=True))
    assert gone == previewed  # not entries[0], which matches the rule only now


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({}, "choose at least one rule"),
        ({"success_rate_below": "2"}, "less than or equal to 1"),
        ({"older_than_step": "-3"}, "greater than or equal to 0"),
    ],
)
def test_a_bad_prune_rule_is_refused_and_deletes_nothing(client, editor, run, entries, params, words):
    client.force_login(editor)
    response = client.post(reverse("bank_prune", args=[run.id]), params | {"confirm": "1"})
    assert response.status_code == 400 and words in response.content.decode()
    assert Experience.objects.live().count() == 3


def test_export_then_import_round_trips_and_a_malformed_file_imports_nothing(
    client, editor, run, entries, embedder
):
    client.force_login(editor)
    response = client.get(reverse("bank_export", args=[run.id]))
    body = b"".join(response.streaming_content).decode()
    lines = body.splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["title"] == "Open doors with keys"
    target = Run.objects.create(name="target", owner=editor)
    upload = SimpleUploadedFile("bank.jsonl", body.encode(), content_type="application/jsonl")
    page = client.post(
        reverse("bank_import", args=[target.id]), {"file": upload}, follow=True
    ).content.decode()
    assert "Imported 3 entries" in page and Experience.objects.in_bank(target.pk).count() == 3
    for bad in [
        b"{not json\n",
        b'{"format": "something else"}\n',
        lines[0].encode() + b'\n{"format": 1}\n',
        b"\xff\xfe",
    ]:
        upload = SimpleUploadedFile("bad.jsonl", bad)
        page = client.post(
            reverse("bank_import", args=[target.id]), {"file": upload}, follow=True
        ).content.decode()
        assert "Nothing was imported" in page, bad
    assert Experience.objects.in_bank(target.pk).count() == 3
    page = client.post(reverse("bank_import", args=[target.id]), {}, follow=True).content.decode()
    assert "Nothing was imported" in page


def test_merge_history_lists_merges_and_an_editor_can_undo_one(client, editor, run, entries, embedder):
    a = entries[0]
    merged_vector = embedder.embed_one("merged")
    from experience.models import Merge

    merge = Merge.objects.create(
        run=run,
        scope="MiniHack",
        step=5,
        decision="changed",
        inputs=[{"id": a.id, "title": a.title, "content": a.content}],
    )
    bank.update(
        a.pk,
        "Merged: doors and monsters",
        "both",
        merged_vector,
        embedding_model=embedder.model_id,
        step=5,
        actor=ExperienceChange.Actor.MERGE,
        kind=ExperienceChange.Kind.MERGE_REWRITE,
        merge=merge,
    )
    client.force_login(editor)
    page = client.get(reverse("bank_merges", args=[run.id])).content.decode()
    assert f'id="merge-{merge.id}"' in page and "Undo merge" in page and "Open doors with keys" in page
    client.post(reverse("bank_merge_undo", args=[run.id, merge.id]))
    a.refresh_from_db()
    assert a.title == "Open doors with keys"


def test_the_banks_page_lists_visible_banks_and_searches_across_them(
    client, editor, other_user, run, entries, embedder
):
    theirs = Run.objects.create(name="their private bank", owner=other_user)
    _add(theirs, "Open the locked door", "Secret advice about doors.", embedder)
    shared = Run.objects.create(name="shared bank", owner=other_user, shared=True)
    _add(shared, "Unlock doors", "Use the key on the door to unlock it.", embedder)
    client.force_login(editor)
    page = client.get(reverse("banks")).content.decode()
    assert "bank run" in page and "shared bank" in page and "their private bank" not in page
    found = client.get(reverse("banks"), {"q": "how do I open a locked door"}).content.decode()
    results = found[found.index('id="search-results"') : found.index('id="bank-runs"')]
    assert "Unlock doors" in results and "Open doors with keys" in results and "Secret advice" not in results
    text = client.get(reverse("banks"), {"q": "monster", "mode": "text"}).content.decode()
    assert "Avoid the monster" in text[text.index('id="search-results"') :]


# ---- imports are untrusted: one schema, nothing taken from the file that names runs, ids or owners -------


def _line(**fields) -> dict:
    base = {"format": "complementary-rl-experience/1", "scope": "MiniHack", "title": "Walk to >",
            "content": "Move toward the staircase down."}  # fmt: skip
    return base | fields


def _import(client, run, *records, raw: bytes | None = None) -> str:
    body = raw if raw is not None else "".join(json.dumps(r) + "\n" for r in records).encode()
    upload = SimpleUploadedFile("bank.jsonl", body, content_type="application/jsonl")
    return client.post(reverse("bank_import", args=[run.id]), {"file": upload}, follow=True).content.decode()


def test_an_import_cannot_write_into_another_users_bank_or_overwrite_their_entry(
    client, editor, other_user, run, embedder
):
    private = Run.objects.create(name="theirs", owner=other_user)
    theirs = _add(private, "Their entry", "private text", embedder)
    client.force_login(editor)
    forged = [{"run_id": private.pk}, {"id": theirs.pk}]
    forged.append({"id": theirs.pk, "run_id": private.pk, "created_at": "2026-01-01"})
    for counters in forged:
        page = _import(client, run, _line(counters=counters))
        assert "Nothing was imported" in page and "counters" in page, counters
    theirs.refresh_from_db()
    assert (theirs.run_id, theirs.title, theirs.content) == (private.pk, "Their entry", "private text")
    assert Experience.objects.filter(run=private).count() == 1
    assert not Experience.objects.filter(run=run).exists()
    assert not ExperienceChange.objects.filter(experience=theirs, kind="import").exists()


@pytest.mark.parametrize(
    ("record", "where"),
    [
        ([1, 2], "line 1"),
        (12, "line 1"),
        (_line(embedding=[float("nan")] * 384), "embedding"),
        (_line(title="t" * 301), "title"),
        (_line(scope="s" * 101), "scope"),
        (_line(counters={"retrieval_count": -1}), "retrieval_count"),
        (_line(counters={"retrieval_count": 10**20}), "retrieval_count"),
        (_line(pinned="maybe"), "pinned"),
        (_line(content="a\x00b"), "NUL"),
        (_line(content=12), "content"),
        (_line(content=["a", "list"]), "content"),
        (_line(content="x" * 20_001), "content"),
        (_line(counters={"unknown": 1}), "unknown"),
    ],
)
def test_a_bad_import_line_is_refused_with_its_reason_and_changes_nothing(client, editor, run, record, where):
    client.force_login(editor)
    raw = (json.dumps(record, allow_nan=True) + "\n").encode()
    page = _import(client, run, raw=raw)
    assert response_ok(page) and "Nothing was imported" in page and where in page, page[:3000]
    assert not Experience.objects.filter(run=run).exists()


def response_ok(page: str) -> bool:
    return "Server Error" not in page and "Traceback" not in page


def test_each_bad_line_is_named_by_its_own_number_and_good_lines_are_not_imported_alone(client, editor, run):
    client.force_login(editor)
    raw = (json.dumps(_line()) + "\n{not json\n" + json.dumps(_line(pinned="no")) + "\n").encode()
    page = _import(client, run, raw=raw)
    assert "2 of 3 lines" in page and "line 2:" in page and "line 3: pinned" in page
    assert not Experience.objects.filter(run=run).exists()


def test_an_all_zero_or_foreign_embedding_is_recomputed_and_counters_are_kept(client, editor, run, embedder):
    client.force_login(editor)
    zero = _line(embedding_model=embedder.model_id, embedding=[0.0] * embedder.dim,
                 counters={"retrieval_count": 4, "guided_successes": 2})  # fmt: skip
    page = _import(client, run, zero)
    assert "Imported 1 entry" in page
    e = Experience.objects.get(run=run)
    assert (
        e.retrieval_count == 4
        and e.guided_successes == 2
        and abs(float(np.linalg.norm(e.embedding)) - 1) < 1e-3
    )


def test_an_export_scope_with_a_nul_byte_is_refused_not_an_error(client, editor, run):
    client.force_login(editor)
    assert client.get(reverse("bank_export", args=[run.id]) + "?scope=%00").status_code == 400


def test_two_edits_from_the_same_version_save_the_first_and_refuse_the_second_showing_the_newer_text(
    client, editor, run, entries
):
    e = entries[0]
    Run.objects.filter(pk=run.pk).update(step=3)
    client.force_login(editor)
    url = reverse("bank_entry", args=[run.id, e.id])
    first = client.post(url, {"title": "First", "content": "first text", "version": e.version})
    second = client.post(url, {"title": "Second", "content": "second text", "version": e.version})
    assert first.status_code == 302 and second.status_code == 409
    page = second.content.decode()
    assert (
        "changed since you opened it" in page and "first text" in page and "second text" in page
    )  # both visible
    e.refresh_from_db()
    assert (e.title, e.content) == ("First", "first text")
    assert (
        ExperienceChange.objects.filter(experience=e, actor="person").latest("id").step == 3
    )  # the run's step


def test_a_deleted_entry_refuses_pin_and_edit_with_a_visible_message(client, editor, run, entries):
    e = entries[0]
    client.force_login(editor)
    client.post(reverse("bank_delete", args=[run.id, e.id]))
    pinned = client.post(reverse("bank_pin", args=[run.id, e.id]), {"pinned": "1"}, follow=True)
    assert "was deleted" in pinned.content.decode() and not Experience.objects.get(pk=e.id).pinned
    url = reverse("bank_entry", args=[run.id, e.id])
    edit = client.post(url, {"title": "x", "content": "y", "version": 2})
    assert edit.status_code == 409 and "was deleted" in edit.content.decode()
    assert Experience.objects.get(pk=e.id).title != "x"


def test_an_edit_of_two_million_characters_is_refused_next_to_the_field(client, editor, run, entries):
    client.force_login(editor)
    url = reverse("bank_entry", args=[run.id, entries[0].id])
    response = client.post(url, {"title": "t", "content": "x" * 2_000_000, "version": 1})
    assert response.status_code == 400 and "at most 20000 characters" in response.content.decode()


def test_a_prune_preview_puts_its_count_and_button_first_and_pages_its_rows(
    client, editor, run, entries, monkeypatch
):
    monkeypatch.setattr(views_bank, "PRUNE_PAGE_ROWS", 2)
    client.force_login(editor)
    url = reverse("bank_prune", args=[run.id])
    rule = {"older_than_step": "100"}  # all three
    page = client.get(url, rule).content.decode()
    assert page.index('id="confirm-prune"') < page.index('id="prune-rows"')
    assert "Delete these 3 entries" in page and 'data-busy="Deleting 3 entries…"' in page
    assert "rows 1–2 of 3" in page and page.count("<tr><td><a href=") == 2
    ids = re.search(r'name="ids" value="([0-9,]*)"', page).group(1)
    assert len(ids.split(",")) == 3  # the button deletes every previewed entry, not only this page's
    second = client.get(url, rule | {"page": "2"}).content.decode()
    assert "rows 3–3 of 3" in second and second.count("<tr><td><a href=") == 1
    assert re.search(r'name="ids" value="([0-9,]*)"', second).group(1) == ids


def test_an_import_into_a_run_whose_episodes_read_other_scopes_says_so(client, editor, run, entries):
    client.force_login(editor)
    body = b"".join(client.get(reverse("bank_export", args=[run.id])).streaming_content)
    cfg = {"method": "complementary", "env": "MiniHack-Room-5x5", "experience": {"scope": "task"}}
    target = Run.objects.create(name="target", owner=editor, method="complementary", config=cfg)
    upload = SimpleUploadedFile("bank.jsonl", body)
    page = client.post(reverse("bank_import", args=[target.id]), {"file": upload}, follow=True)
    text = html.unescape(page.content.decode())
    assert "Imported 3 entries" in text
    assert (
        "3 entries are in a scope no episode of this run retrieves from (MiniHack: 3); its episodes read "
        "MiniHack-Room-5x5." in text
    )
    shared = Run.objects.create(name="shared", owner=editor, config=cfg | {"experience": {"scope": "shared"}})
    Experience.objects.in_bank(target.pk).update(scope="MiniHack-Room-5x5")
    assert views_bank.unread_scopes_warning(target) == ""
    assert views_bank.unread_scopes_warning(shared) == ""  # an empty bank


def test_a_finished_background_import_updates_the_pages_count_without_a_reload(client, editor, run, entries):
    client.force_login(editor)
    job = ImportJob.objects.create(run=run, status=ImportJob.Status.SUCCEEDED, entries=3)
    page = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
    assert '<span class="muted" id="bank-size" hx-swap-oob="true">3 entries now</span>' in page
    job.status = ImportJob.Status.EMBEDDING
    job.save()
    page = client.get(reverse("bank_import_job", args=[run.id, job.id])).content.decode()
    assert "hx-swap-oob" not in page  # still running: the page keeps polling this line only

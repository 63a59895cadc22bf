"""Edits, pins and deletes of a bank entry never overwrite text the person has not seen: an edit always says
which version it started from; a missing or stale version, or a deleted entry, is a 409 whose message says
what happened and what to do, with the person's text kept."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from experience import services
from experience.bank import EntryChanged, EntryDeleted
from experience.models import Experience
from webapp.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def editor(user):
    user.user_permissions.add(Permission.objects.get(codename="edit_bank"))
    return user


@pytest.fixture
def entry(editor):
    run = Run.objects.create(name="bank run", owner=editor, method="complementary")
    return services.experience_add(run, "MiniHack", "Open doors", "Pick up the key, then open the door.")


def _edit_url(entry: Experience) -> str:
    return reverse("bank_entry", args=[entry.run_id, entry.id])


def test_an_edit_without_its_version_is_a_409_that_keeps_the_text_and_overwrites_nothing(
    client, editor, entry
):
    client.force_login(editor)
    response = client.post(_edit_url(entry), {"title": "Mine", "content": "my new text"})
    page = response.content.decode()
    assert response.status_code == 409 and "did not say which version of the entry you edited" in page
    assert "Reload the entry" in page and "my new text" in page
    entry.refresh_from_db()
    assert (entry.title, entry.version) == ("Open doors", 1)


def test_a_stale_edit_is_a_409_showing_the_newer_text_and_keeping_the_persons(client, editor, entry):
    services.experience_edit(entry, "Open doors", "Someone else's newer text.", expected_version=1)
    client.force_login(editor)
    response = client.post(_edit_url(entry), {"title": "Mine", "content": "my text", "version": "1"})
    page = response.content.decode()
    assert response.status_code == 409
    assert "this entry changed since you opened it (it is now version 2)" in page
    assert (
        "Someone else&#x27;s newer text." in page
        and "my text" in page
        and "Reload to see the new text" in page
    )
    entry.refresh_from_db()
    assert entry.content == "Someone else's newer text."


def test_editing_a_deleted_entry_is_a_409_saying_it_was_deleted_and_how_to_restore_it(client, editor, entry):
    services.experience_delete(entry, user=editor)
    client.force_login(editor)
    response = client.post(_edit_url(entry), {"title": "Mine", "content": "my text", "version": "2"})
    page = response.content.decode()
    assert response.status_code == 409 and "this entry was deleted" in page
    assert "Undo next to its deletion in the history restores it" in page and "my text" in page
    assert Experience.objects.get(pk=entry.pk).title == "Open doors"


def test_a_deleted_entrys_page_says_how_to_restore_it(client, editor, entry):
    services.experience_delete(entry, user=editor)
    client.force_login(editor)
    page = client.get(_edit_url(entry)).content.decode()
    assert 'id="deleted-note"' in page and "restores it" in page


def test_a_stale_delete_or_pin_from_the_page_is_refused_with_a_message(client, editor, entry):
    services.experience_edit(entry, "Open doors", "Newer text.", expected_version=1)
    client.force_login(editor)
    deleted = client.post(
        reverse("bank_delete", args=[entry.run_id, entry.id]), {"version": "1"}, follow=True
    )
    assert "Not deleted: this entry changed since you opened it" in deleted.content.decode()
    row = client.post(
        reverse("bank_pin", args=[entry.run_id, entry.id]),
        {"pinned": "1", "version": "1"},
        headers={"HX-Request": "true", "HX-Target": f"entry-{entry.id}"},
    )
    assert (
        row.status_code == 409
        and "Not pinned: this entry changed since you opened it" in row.content.decode()
    )
    entry.refresh_from_db()
    assert not entry.is_deleted and not entry.pinned


def test_pin_and_delete_with_the_current_version_go_through(client, editor, entry):
    client.force_login(editor)
    client.post(reverse("bank_pin", args=[entry.run_id, entry.id]), {"pinned": "1", "version": "1"})
    entry.refresh_from_db()
    assert entry.pinned and entry.version == 2
    client.post(reverse("bank_delete", args=[entry.run_id, entry.id]), {"version": "2"})
    assert Experience.objects.get(pk=entry.pk).is_deleted


def test_the_entry_pages_pin_and_delete_forms_carry_the_version(client, editor, entry):
    client.force_login(editor)
    page = client.get(_edit_url(entry)).content.decode()
    assert page.count('<input type="hidden" name="version" value="1">') == 2


def test_the_service_names_a_stale_edit_and_a_deleted_entry(editor, entry):
    services.experience_edit(entry, "t", "newer", expected_version=1)
    with pytest.raises(EntryChanged) as stale:
        services.experience_edit(entry, "t", "older", expected_version=1)
    assert stale.value.version == 2
    services.experience_delete(entry)
    with pytest.raises(EntryDeleted):
        services.experience_edit(entry, "t", "x", expected_version=3)

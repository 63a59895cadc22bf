"""Services and selectors: people's edits (recorded, undoable), search, filters, prune previews."""

from __future__ import annotations

import threading
import time

import pytest

from experience import services
from experience.manager import ExperienceManager
from experience.models import ExperienceChange
from experience.selectors import (
    PruneRule,
    experience_history,
    experience_list,
    experience_prune_preview,
    experience_scopes,
    experience_semantic_search,
    experience_text_search,
)

Kind = ExperienceChange.Kind


@pytest.fixture
def bank(run, user, embedder):
    heat = services.experience_add(
        run, "alfworld", "Heat with the microwave", "Heat X with microwave, then place X."
    )
    cool = services.experience_add(
        run, "alfworld", "Cool with the fridge", "Cool X with fridge, then place X."
    )
    shoes = services.experience_add(
        run, "webshop", "Filter by size", "Search with the size and colour of shoes."
    )
    return heat, cool, shoes


@pytest.mark.django_db
def test_a_persons_edit_is_recorded_with_the_person_and_can_be_undone(run, user, bank):
    heat, _, _ = bank
    edited = services.experience_edit(
        heat, "Microwave heating", "Open the microwave first, then heat X.", user=user, expected_version=1
    )
    assert (edited.title, edited.version) == ("Microwave heating", 2)
    change = experience_history(edited).first()
    assert (change.kind, change.actor, change.user) == (Kind.UPDATE, "person", user)
    services.experience_undo(change, user=user)
    heat.refresh_from_db()
    assert heat.title == "Heat with the microwave" and heat.version == 3
    assert [c.kind for c in experience_history(heat)] == [Kind.UNDO, Kind.UPDATE, Kind.ADD]


@pytest.mark.django_db
def test_pin_delete_and_filters(run, user, bank):
    heat, cool, shoes = bank
    services.experience_pin(heat, user=user)
    services.experience_delete(cool, user=user)
    assert [e.pk for e in experience_list(run)] == [shoes.pk, heat.pk]
    assert [e.pk for e in experience_list(run, pinned=True)] == [heat.pk]
    assert [e.pk for e in experience_list(run, scope="webshop")] == [shoes.pk]
    assert cool.pk in [e.pk for e in experience_list(run, include_deleted=True)]
    assert experience_scopes(run) == ["alfworld", "webshop"]
    heat.__class__.objects.filter(pk=shoes.pk).update(retrieval_count=4)
    assert [e.pk for e in experience_list(run, min_retrievals=1)] == [shoes.pk]
    assert [e.pk for e in experience_list(run, max_retrievals=0)] == [heat.pk]


@pytest.mark.django_db
def test_semantic_and_full_text_search(run, bank, embedder):
    heat, cool, shoes = bank
    found = list(experience_semantic_search(run, "warm up my food", embedder=embedder))
    assert found[0].pk == heat.pk and found[0].similarity > found[-1].similarity
    assert [e.pk for e in experience_semantic_search(run, "trainers", scope="webshop")] == [shoes.pk]
    assert [e.pk for e in experience_text_search(run, "fridge")] == [cool.pk]
    assert [e.pk for e in experience_text_search(run, "heating")] == [heat.pk]  # English stemming
    assert list(experience_text_search(run, "teleport")) == []


@pytest.mark.django_db
def test_prune_preview_lists_exactly_what_prune_deletes(run, user, bank):
    heat, cool, shoes = bank
    model = heat.__class__
    model.objects.filter(pk=heat.pk).update(
        retrieval_count=3, guided_successes=1, guided_failures=3, updated_step=9
    )
    model.objects.filter(pk=cool.pk).update(
        retrieval_count=2, guided_successes=2, guided_failures=0, updated_step=2
    )
    model.objects.filter(pk=shoes.pk).update(updated_step=9)
    assert [e.pk for e in experience_prune_preview(run, PruneRule(never_retrieved=True))] == [shoes.pk]
    assert [e.pk for e in experience_prune_preview(run, PruneRule(success_rate_below=0.5))] == [heat.pk]
    assert [e.pk for e in experience_prune_preview(run, PruneRule(older_than_step=5))] == [cool.pk]
    assert list(experience_prune_preview(run, PruneRule())) == []
    either = PruneRule(never_retrieved=True, success_rate_below=0.5, combine="any")
    both = PruneRule(success_rate_below=0.5, older_than_step=5)  # all criteria by default: each narrows
    assert [e.pk for e in experience_prune_preview(run, both)] == []
    assert [
        e.pk for e in experience_prune_preview(run, PruneRule(success_rate_below=0.5, older_than_step=10))
    ] == [heat.pk]
    services.experience_pin(shoes, user=user)  # pinned entries are never pruned
    assert [e.pk for e in experience_prune_preview(run, either)] == [heat.pk]
    n, batch = services.experience_prune(run, [heat.pk, shoes.pk], user=user)  # exactly the ids confirmed
    assert n == 1 and [e.pk for e in experience_list(run)] == [shoes.pk, cool.pk]
    assert services.prune_undo(run, batch, user=user) == 1
    assert sorted(e.pk for e in experience_list(run)) == sorted([heat.pk, shoes.pk, cool.pk])


@pytest.mark.django_db(transaction=True)
def test_a_persons_edit_waits_for_the_live_managers_writer_lock(run, user, embedder):
    entry = services.experience_add(run, "alfworld", "Heat with the microwave", "Heat X with microwave.")
    done = threading.Event()
    with ExperienceManager(run.pk, embedder=embedder) as manager:

        def edit() -> None:
            from django.db import connection

            services.experience_edit(
                entry,
                "Edited",
                "Edited while the extractor wrote.",
                user=user,
                expected_version=entry.version,
            )
            done.set()
            connection.close()

        with manager.rw.write():  # the extractor is applying operations
            thread = threading.Thread(target=edit)
            thread.start()
            time.sleep(0.5)
            assert not done.is_set()
        thread.join(30)
        assert done.is_set() and manager.entries([entry.pk])[0].title == "Edited"

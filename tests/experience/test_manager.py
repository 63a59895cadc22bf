"""ExperienceManager against the real database and the real MiniLM embedder."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from experience.bank import BankError
from experience.manager import ExperienceManager
from experience.models import Experience, ExperienceChange, Merge, SearchAsk
from trainer.store import (
    Add,
    Delete,
    ExperienceStore,
    Generation,
    GuidedOutcome,
    MergeAction,
    MergePlan,
    Refinement,
    Return,
    Update,
)
from webapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

Kind = ExperienceChange.Kind

HEAT = Add(
    "alfworld",
    "Heat an object with the microwave",
    "To heat X: find X, take X, go to the microwave, heat X with microwave, then bring X to the target.",
)
COOL = Add(
    "alfworld",
    "Cool an object in the fridge",
    "To cool X: take X, go to the fridge, cool X with fridge, then put X in or on the target receptacle.",
)
DOOR = Add(
    "minihack",
    "Locked doors need a key",
    "If a door is locked, pick up the key first; if the room is dark, walk along the walls to find exits.",
)
SEARCH = Add(
    "webshop",
    "Search with the required attributes",
    "Put colour, size and the price limit into the search query; open items whose title matches them.",
)
HEAT_QUERY = (
    "goal: heat some mug and put it in coffeemachine, observation: you are in the middle of a kitchen"
)


def add(manager: ExperienceManager, *ops: Add, step: int = 0) -> list[int]:
    results = manager.apply(list(ops), step=step)
    assert all(r.ok for r in results), results
    return [r.entry_id for r in results]


def test_it_implements_the_trainer_protocol(manager):
    assert isinstance(manager, ExperienceStore)


def test_add_update_delete_and_return_are_applied_and_recorded(manager):
    generation = Generation("prompt", "<add>...</add>", (5, 6, 7), (-0.1, -0.2, -0.3), weight_version=3)
    heat_id, cool_id = add(
        manager, HEAT, Add(COOL.scope, COOL.title, COOL.content, generation, "ep-7"), step=2
    )
    assert manager.size() == 2 and manager.size("alfworld") == 2 and manager.size("webshop") == 0
    cool = Experience.objects.get(pk=cool_id)
    assert (cool.source_episode, cool.created_step, cool.version) == ("ep-7", 2, 1)
    assert manager.generations([cool_id]) == {cool_id: generation}
    assert cool.changes.get().kind == Kind.ADD and cool.changes.get().before is None

    [result] = manager.apply(
        [Update(heat_id, "Heat in the microwave", "Take X, heat X with microwave.")], step=4
    )
    assert result.ok and result.entry_id == heat_id
    heat = Experience.objects.get(pk=heat_id)
    assert (heat.title, heat.version, heat.updated_step) == ("Heat in the microwave", 2, 4)
    change = heat.changes.order_by("-id").first()
    assert (change.kind, change.actor, change.step) == (Kind.UPDATE, "extractor", 4)
    assert manager.generations([heat_id]) == {heat_id: Generation()}  # the update was written by hand
    assert change.before["title"] == HEAT.title and change.after["title"] == "Heat in the microwave"

    n_changes = ExperienceChange.objects.count()
    assert manager.apply([Return()], step=5)[0].entry_id is None
    assert ExperienceChange.objects.count() == n_changes

    [result] = manager.apply([Delete(cool_id)], step=6)
    assert result.ok and manager.size() == 1
    cool.refresh_from_db()
    assert cool.deleted_at is not None and cool.changes.order_by("-id").first().kind == Kind.DELETE
    assert manager.entries([heat_id, cool_id])[0].id == heat_id and len(manager.entries([cool_id])) == 0


def test_refused_operations_change_nothing(manager, user):
    [heat_id] = add(manager, HEAT)
    other_run = Run.objects.create(name="other", owner=user)
    foreign = Experience.objects.create(
        run=other_run, title="t", content="c", embedding=np.ones(384) / 384**0.5
    )
    Experience.objects.filter(pk=heat_id).update(pinned=True)
    results = manager.apply(
        [Update(heat_id, "x", "y"), Delete(heat_id), Update(foreign.pk, "x", "y"), Delete(10**9)], step=1
    )
    assert [r.ok for r in results] == [False, False, False, False]
    assert "pinned" in results[0].error and "another run" in results[2].error
    assert Experience.objects.get(pk=heat_id).title == HEAT.title
    assert ExperienceChange.objects.filter(kind=Kind.UPDATE).count() == 0


def test_a_keyed_batch_applies_once_and_a_refusal_in_it_leaves_its_other_operations(manager):
    [heat_id] = add(manager, HEAT)
    Experience.objects.filter(pk=heat_id).update(pinned=True)
    batch = [COOL, Update(heat_id, "x", "y"), DOOR]
    first = manager.apply(batch, step=2, key="a1b2c3d4:0/0")
    assert [r.ok for r in first] == [True, False, True] and "pinned" in first[1].error
    live = sorted(Experience.objects.in_bank(manager.run_id, None).values_list("pk", flat=True))
    assert len(live) == 3
    # the resumed process does the batch again: nothing is applied twice, the outcomes are the first's
    again = manager.apply(batch, step=2, key="a1b2c3d4:0/0")
    assert [(r.entry_id, r.error) for r in again] == [(r.entry_id, r.error) for r in first]
    assert sorted(Experience.objects.in_bank(manager.run_id, None).values_list("pk", flat=True)) == live
    assert ExperienceChange.objects.filter(kind=Kind.ADD).count() == 3
    # another key, or none, is another batch
    assert manager.apply([SEARCH], step=2, key="a1b2c3d4:0/1")[0].ok
    assert manager.apply([SEARCH], step=2)[0].ok and manager.size() == 5


def test_retrieval_finds_the_closest_entry_within_the_scope(manager):
    heat_id, cool_id, door_id, search_id = add(manager, HEAT, COOL, DOOR, SEARCH)
    [[best]] = manager.retrieve([HEAT_QUERY], "alfworld")
    assert best.id == heat_id and best.similarity > 0.3 and best.score == 0.0  # s_rank of the best: -0
    [[door]] = manager.retrieve(["goal: find the staircase down, observation: a dark room"], "minihack")
    assert door.id == door_id
    assert manager.retrieve([HEAT_QUERY], "sokoban") == [[]]
    top2 = manager.retrieve(["goal: cool a tomato and put it in the fridge"], "alfworld", k=2)[0]
    assert [e.id for e in top2] == [cool_id, heat_id]


def test_retrievals_are_counted_once_per_query(manager):
    [heat_id] = add(manager, HEAT)
    results = manager.retrieve([HEAT_QUERY] * 5, "alfworld")
    assert {r[0].id for r in results} == {heat_id}
    heat = Experience.objects.get(pk=heat_id)
    assert heat.retrieval_count == 5 and heat.last_retrieved_at is not None


def test_the_generation_behind_the_version_an_actor_saw_outlives_a_rewrite(manager):
    first = Generation("p1", "<add>heat</add>", (5, 6), (-0.1, -0.2), weight_version=1)
    second = Generation("p2", "<update>heat</update>", (7, 8, 9), (-0.3, -0.4, -0.5), weight_version=2)
    [heat_id] = add(manager, Add(HEAT.scope, HEAT.title, HEAT.content, first))
    [[seen]] = manager.retrieve([HEAT_QUERY], "alfworld")  # an actor reads version 1 ...
    manager.apply([Update(heat_id, "Heat it", "Use the microwave.", second)], step=2)  # ... then it changes
    assert seen.version == 1 and Experience.objects.get(pk=heat_id).version == 2
    assert manager.generations([heat_id], {heat_id: seen.version}) == {heat_id: first}
    assert manager.generations([heat_id], {heat_id: 2}) == manager.generations([heat_id]) == {heat_id: second}
    assert manager.generations([heat_id], {heat_id: 7}) == {}  # a version that never was: not credited


def test_read_only_retrievals_leave_the_counters_and_the_next_ranking_alone(manager):
    heat_id, cool_id = add(manager, HEAT, COOL)
    # whether they land in one batch or not, read-only queries never demote what they find
    assert {r[0].id for r in manager.retrieve([HEAT_QUERY] * 3, "alfworld", count=False)} == {heat_id}
    assert Experience.objects.get(pk=heat_id).retrieval_count == 0
    [[counted]] = manager.retrieve([HEAT_QUERY], "alfworld")
    assert counted.id == heat_id and Experience.objects.get(pk=heat_id).retrieval_count == 1
    [[after]] = manager.retrieve([HEAT_QUERY], "alfworld", count=False)  # sees the ranking as it stands
    assert after.id == cool_id
    for _ in range(3):  # evaluation-style reads: no demotion from their own retrievals
        [[entry]] = manager.retrieve(["goal: cool a tomato, observation: a fridge"], "alfworld", count=False)
        assert entry.id == cool_id and entry.score == 0.0  # the best for its query, never retrieved
    cool = Experience.objects.get(pk=cool_id)
    assert cool.retrieval_count == 0 and cool.last_retrieved_at is None


def test_a_burst_of_queries_is_batched_and_identical_queries_share_one_search(run, embedder):
    # a generous t_max: the batches' make-up must not depend on how loaded the machine is (at 1 ms a busy
    # machine can flush single queries to parallel workers that rank them on counts not yet updated)
    with ExperienceManager(run.pk, embedder=embedder, max_wait_s=0.5) as manager:
        add(manager, HEAT, COOL)
        goals = ["heat a mug", "cool an apple", "heat a potato", "cool a tomato"]
        queries = [f"goal: {g}, observation: a kitchen" for g in goals for _ in range(8)]  # 4 groups of 8
        results = manager.retrieve(queries, "alfworld")
        stats = manager.stats
    assert all(len(r) == 1 for r in results)
    # (which entries a group gets depends on whether the other groups' searches of its batch, run by
    # parallel workers, counted their retrievals before its own search: see the next test for the order)
    # Identical queries in a batch share a search; a burst submitted at once fills batches of up to 16.
    assert stats.queries == 32 and stats.searches <= len(goals) * stats.batches
    assert stats.batches < 32 and stats.mean_batch > 1
    counts = Experience.objects.values_list("retrieval_count", flat=True)
    assert sum(counts) == 32 and min(counts) > 0


def test_identical_queries_of_one_batch_are_served_in_turn(run, embedder):
    with ExperienceManager(run.pk, embedder=embedder, max_wait_s=0.5) as manager:
        heat_id, cool_id = add(manager, HEAT, COOL)
        results = manager.retrieve([HEAT_QUERY] * 5, "alfworld")
        stats = manager.stats
    assert stats.searches == 1
    # in a fresh bank the second pick finds the best entry recent (one rank step down) and takes the other;
    # once both are recent, relevance (−rank) decides again until usage outweighs it
    assert [r[0].id for r in results] == [heat_id, cool_id, heat_id, heat_id, heat_id]
    counts = dict(Experience.objects.values_list("id", "retrieval_count"))
    assert counts == {heat_id: 4, cool_id: 1}


@pytest.mark.parametrize("workers", [1, 3])
def test_a_batch_of_different_queries_answers_as_retrieving_them_one_after_another(run, embedder, workers):
    """Each counted pick demotes its entry for the later queries of the same batch, whichever worker threads
    fetched them: a batch gives what separate calls in its order give (a run replays exactly)."""
    queries = [HEAT_QUERY, HEAT_QUERY.replace("mug", "cup"), HEAT_QUERY.replace("mug", "potato")]
    one_by_one = []
    with ExperienceManager(run.pk, embedder=embedder) as manager:
        ids = add(manager, HEAT, COOL)
        for q in queries:
            [[entry]] = manager.retrieve([q], "alfworld")
            one_by_one.append(ids.index(entry.id))
    other = Run.objects.create(owner=run.owner, name="the same bank again", method=run.method)
    with ExperienceManager(other.pk, embedder=embedder, max_wait_s=0.5, workers=workers) as manager:
        ids = add(manager, HEAT, COOL)
        batched = [ids.index(e.id) for [e] in manager.retrieve(queries, "alfworld")]
        stats = manager.stats
    assert stats.batches == 1 and stats.searches == 3  # one batch, its searches on one or three workers
    assert batched == one_by_one == [0, 1, 0]  # each query saw the picks before it, as one after another
    counts = dict(Experience.objects.filter(run=other).values_list("title", "retrieval_count"))
    assert counts == {HEAT.title: 2, COOL.title: 1}


def test_a_just_retrieved_entry_is_demoted(manager):
    heat_id, cool_id = add(manager, HEAT, COOL)
    [[first]] = manager.retrieve([HEAT_QUERY], "alfworld")
    [[second]] = manager.retrieve([HEAT_QUERY], "alfworld")
    assert (first.id, second.id) == (heat_id, cool_id)
    assert second.score == pytest.approx(-1.0)  # never retrieved: s = s_rank = -rank, and it ranks second
    [[third]] = manager.retrieve([HEAT_QUERY], "alfworld")  # both recent now, each retrieved once
    assert third.id == heat_id
    assert third.score == pytest.approx(0.0 - 0.4 * np.log(2) - 1.0)


def test_an_often_retrieved_entry_is_demoted_and_the_switch_turns_it_off(run, embedder):
    with ExperienceManager(run.pk, embedder=embedder) as manager:
        heat_id, cool_id = add(manager, HEAT, COOL)
        long_ago = timezone.now() - timedelta(hours=1)
        Experience.objects.filter(pk=heat_id).update(retrieval_count=30, last_retrieved_at=long_ago)
        [[best]] = manager.retrieve([HEAT_QUERY], "alfworld")
        assert best.id == cool_id
    Experience.objects.filter(pk=heat_id).update(retrieval_count=30, last_retrieved_at=long_ago)
    with ExperienceManager(run.pk, embedder=embedder, diversify=False) as plain:
        [[best]] = plain.retrieve([HEAT_QUERY], "alfworld")
        assert best.id == heat_id and best.score == best.similarity


def test_a_search_and_ask_exchange_is_recorded_and_credited(manager):
    [heat_id] = add(manager, HEAT)
    [[entry]] = manager.retrieve(["how do I heat the mug?"], "alfworld", k=1)
    refined = Refinement("For your task: heat the mug", Generation("p", "r", (1,), (-0.5,), 2))
    exchange_id = manager.record_ask(
        "how do I heat the mug?", "alfworld", entry, refined, episode_id="ep-1", step=3
    )
    exchange = SearchAsk.objects.get(pk=exchange_id)
    assert (exchange.experience_id, exchange.refined, exchange.step) == (heat_id, refined.text, 3)
    assert exchange.similarity == pytest.approx(entry.similarity)
    assert exchange.generation_logprobs == [-0.5] and exchange.success is None

    manager.record_outcomes([GuidedOutcome("ep-1", True, heat_id), GuidedOutcome("ep-2", False, heat_id)])
    exchange.refresh_from_db()
    heat = Experience.objects.get(pk=heat_id)
    assert exchange.success is True
    assert (heat.guided_successes, heat.guided_failures, heat.success_rate) == (1, 1, 0.5)

    nothing = manager.record_ask("anything", "sokoban", None, Refinement("no entry for anything"))
    assert SearchAsk.objects.get(pk=nothing).experience_id is None


def test_training_counters(manager):
    heat_id, cool_id = add(manager, HEAT, COOL)
    manager.record_training([heat_id, cool_id], step=4)
    manager.record_training([heat_id], step=7)
    heat, cool = (manager.entries([i])[0] for i in (heat_id, cool_id))
    assert (heat.training_count, heat.last_trained_step) == (2, 7)
    assert (cool.training_count, cool.last_trained_step) == (1, 4)


def test_capacity_evicts_the_oldest_unpinned_entries(run, embedder):
    with ExperienceManager(run.pk, embedder=embedder, capacity=3) as manager:
        first, second = add(manager, HEAT, COOL)
        Experience.objects.filter(pk=first).update(pinned=True)
        newer = add(manager, DOOR, SEARCH, Add("alfworld", "Clean with the sink", "Clean X with sinkbasin."))
        live = set(Experience.objects.in_bank(run.pk).values_list("id", flat=True))
        assert live == {first, newer[1], newer[2]}
        evicted = ExperienceChange.objects.filter(kind=Kind.EVICT).values_list("experience_id", flat=True)
        assert sorted(evicted) == [second, newer[0]]


# ---- merge ---------------------------------------------------------------------------------------------

LESSONS = [
    Add("alfworld", f"Lesson {i}", f"Step {i}: check receptacle {i} before searching elsewhere.")
    for i in range(12)
]


def merge_all(chunk):
    """A merge function that fuses its whole chunk into one entry (a stand-in for the extractor)."""
    content = " ".join(e.content for e in chunk)
    return MergePlan(
        (MergeAction("merge", tuple(e.id for e in chunk), "Merged lessons", content),), raw="<merge/>"
    )


def test_merge_carries_the_output_across_chunks_and_never_drops_a_pinned_entry(manager):
    ids = add(manager, *LESSONS)
    Experience.objects.filter(pk=ids[2]).update(pinned=True)
    chunks_seen = []

    def fn(chunk):
        chunks_seen.append([e.id for e in chunk])
        return merge_all(chunk)

    report = manager.merge("alfworld", fn, step=5)
    # 12 entries, N = 5: [e0..e4] -> m1; [m1, e5..e9] -> m2; [m2, e10, e11] -> m3
    assert chunks_seen[0] == ids[:5]
    assert chunks_seen[1][1:] == ids[5:10] and chunks_seen[2][1:] == ids[10:]
    m1, m2 = chunks_seen[1][0], chunks_seen[2][0]
    assert Merge.objects.get(pk=report.merge_ids[0]).carried == [m1]
    assert (report.chunks, report.created, report.removed) == (3, 3, 11 + 2)  # 11 originals, m1, m2
    live = list(Experience.objects.in_bank(manager.run_id, "alfworld").order_by("id"))
    assert [e.pk for e in live] == [ids[2], live[1].pk]
    final = live[1]
    assert all(lesson.content in final.content for lesson in LESSONS)  # nothing lost along the window
    assert live[0].title == "Lesson 2" and live[0].version == 1
    assert {m1, m2} <= set(Experience.objects.filter(deleted_at__isnull=False).values_list("id", flat=True))
    merge = Merge.objects.get(pk=report.merge_ids[0])
    assert merge.decision == Merge.Decision.CHANGED and merge.step == 5
    assert [i["id"] for i in merge.inputs] == ids[:5] and merge.outputs == [m1]


def test_a_pass_that_rewrites_everything_is_still_one_call_per_chunk_of_the_bank(manager):
    ids = add(manager, *LESSONS)
    sizes = []

    def rewrite_all(chunk):
        sizes.append(len(chunk))
        actions = tuple(MergeAction("rewrite", (e.id,), e.title, e.content + " Again.") for e in chunk)
        return MergePlan(actions, raw="<rewrite/>")

    report = manager.merge("alfworld", rewrite_all, step=5)
    # each chunk's own 5 entries plus at most 4 carried: 5, 4 + 5, 4 + 2; ⌈12 / 5⌉ = 3 calls, not 12 - 4
    assert sizes == [5, 9, 6] and report.chunks == 3 and report.rewritten == 20
    assert manager.size("alfworld") == len(ids)


def test_unparseable_or_invalid_merge_output_keeps_the_originals(manager):
    ids = add(manager, *LESSONS[:4])
    report = manager.merge("alfworld", lambda chunk: MergePlan(None, raw="I think they are fine?"), step=1)
    assert report.unparseable == 1 and manager.size("alfworld") == 4
    assert Merge.objects.get().raw_output == "I think they are fine?"
    bogus = MergePlan((MergeAction("discard", (ids[0], 10**9)),))  # an id that is not in the chunk
    report = manager.merge("alfworld", lambda chunk: bogus, step=2)
    assert report.unparseable == 1 and manager.size("alfworld") == 4
    assert all(e.version == 1 for e in Experience.objects.all())


def test_merge_discards_rewrites_but_spares_pinned(manager):
    a, b, c = add(manager, *LESSONS[:3])
    Experience.objects.filter(pk=c).update(pinned=True)
    plan = MergePlan(
        (
            MergeAction("discard", (a,)),
            MergeAction("rewrite", (b,), "Check receptacles", "Check each receptacle once, nearest first."),
            MergeAction("discard", (c,)),
        )
    )
    report = manager.merge("alfworld", lambda chunk: plan, step=3)
    assert (report.removed, report.rewritten) == (1, 1)
    live = {e.pk: e for e in Experience.objects.in_bank(manager.run_id)}
    assert set(live) == {b, c} and live[b].title == "Check receptacles" and live[b].version == 2
    [[found]] = manager.retrieve(["nearest receptacle first"], "alfworld")
    assert found.id == b  # the rewrite was re-embedded


def test_merge_leaves_a_chunk_alone_if_an_entry_changed_meanwhile(manager):
    a, b = add(manager, *LESSONS[:2])

    def slow_extractor(chunk):
        manager.apply([Update(a, "Edited meanwhile", "A person or the extractor changed this.")], step=4)
        return merge_all(chunk)

    report = manager.merge("alfworld", slow_extractor, step=4)
    assert report.stale == 1 and manager.size() == 2
    assert Experience.objects.get(pk=a).title == "Edited meanwhile"


# ---- undo ----------------------------------------------------------------------------------------------


def test_undo_of_an_edit_restores_text_and_embedding(manager):
    [heat_id] = add(manager, HEAT)
    original = np.array(Experience.objects.get(pk=heat_id).embedding)
    manager.apply([Update(heat_id, "Wash in the sink", "Clean X with sinkbasin, then put it back.")], step=2)
    change = ExperienceChange.objects.get(kind=Kind.UPDATE)
    undo = manager.undo(change.pk)
    heat = Experience.objects.get(pk=heat_id)
    assert (heat.title, heat.content, heat.version) == (HEAT.title, HEAT.content, 3)
    np.testing.assert_allclose(np.array(heat.embedding), original, atol=1e-5)
    change.refresh_from_db()
    assert change.undone_by == undo and undo.kind == Kind.UNDO
    with pytest.raises(BankError, match="already undone"):
        manager.undo(change.pk)


def test_undo_refuses_to_skip_a_later_change(manager):
    [heat_id] = add(manager, HEAT)
    manager.apply([Update(heat_id, "v2", "second text")], step=1)
    manager.apply([Update(heat_id, "v3", "third text")], step=2)
    older = ExperienceChange.objects.filter(kind=Kind.UPDATE).order_by("id").first()
    with pytest.raises(BankError, match="undo the later changes first"):
        manager.undo(older.pk)
    assert Experience.objects.get(pk=heat_id).title == "v3"


def test_undo_of_a_merge_restores_the_originals(manager):
    ids = add(manager, *LESSONS[:5])
    report = manager.merge("alfworld", merge_all, step=5)
    assert manager.size("alfworld") == 1
    manager.undo_merge(report.merge_ids[0])
    live = list(Experience.objects.in_bank(manager.run_id, "alfworld").order_by("id"))
    assert [e.pk for e in live] == ids
    assert [e.content for e in live] == [lesson.content for lesson in LESSONS[:5]]
    assert Merge.objects.get(pk=report.merge_ids[0]).undone_at is not None
    [[found]] = manager.retrieve(["check receptacle 3"], "alfworld")
    assert found.id in ids


# ---- export / import -----------------------------------------------------------------------------------


def test_jsonl_round_trip_is_lossless(manager, user, embedder):
    generation = Generation("extract lessons", "<add>Heat…</add>", (11, 12), (-0.25, -1.5), weight_version=9)
    unicode_heat = Add(HEAT.scope, HEAT.title, "Chauffer — 加熱 " + HEAT.content, generation, "ep-3")
    heat_id, _, door_id = add(manager, unicode_heat, COOL, DOOR, step=4)
    manager.retrieve([HEAT_QUERY], "alfworld")
    manager.record_outcomes([GuidedOutcome("ep-9", True, heat_id)])
    manager.record_training([heat_id], step=6)
    Experience.objects.filter(pk=door_id).update(pinned=True)
    exported = io.StringIO()
    assert manager.export_jsonl(exported) == 3

    other = Run.objects.create(name="copy", owner=user)
    with ExperienceManager(other.pk, embedder=embedder) as copy:
        assert copy.import_jsonl(io.StringIO(exported.getvalue()), user=user) == 3
        again = io.StringIO()
        copy.export_jsonl(again)
    assert again.getvalue() == exported.getvalue()
    first = json.loads(exported.getvalue().splitlines()[0])
    assert first["counters"]["retrieval_count"] == 1 and first["counters"]["guided_successes"] == 1
    assert first["provenance"]["generation"]["logprobs"] == [-0.25, -1.5]
    assert ExperienceChange.objects.filter(run=other, kind=Kind.IMPORT, user=user).count() == 3


def test_import_recomputes_embeddings_from_another_model(manager, user, embedder):
    add(manager, HEAT)
    exported = io.StringIO()
    manager.export_jsonl(exported)
    record = json.loads(exported.getvalue())
    record["embedding_model"], record["embedding"] = "some-other-model", [1.0] + [0.0] * 767
    other = Run.objects.create(name="other", owner=user)
    with ExperienceManager(other.pk, embedder=embedder) as copy:
        copy.import_jsonl(io.StringIO(json.dumps(record) + "\n"))
    imported = Experience.objects.get(run=other)
    expected = embedder.embed_one(f"{HEAT.title}\n{HEAT.content}")
    np.testing.assert_allclose(np.array(imported.embedding), expected, atol=1e-5)
    assert imported.embedding_model == embedder.model_id


def test_one_live_manager_per_run(manager, embedder):
    with pytest.raises(RuntimeError, match="already has a live ExperienceManager"):
        ExperienceManager(manager.run_id, embedder=embedder)

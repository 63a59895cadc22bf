"""The extractor's background track over the real bank, the real SmolLM2 extractor and its engine: credits
and episodes submitted while a merge pass runs are taken in between its chunks, not after the whole pass; a
checkpoint keeps the unfinished work, and a resumed track does exactly what the lost one had not finished."""

from __future__ import annotations

import dataclasses
import itertools
import threading

import pytest

from experience.models import Experience
from tests.conftest import wait_for
from tests.trainer.recording import Recorder
from trainer.extractor.credit import CreditBuffer
from trainer.extractor.model import DistilRequest, Extractor
from trainer.extractor.prompts import Step
from trainer.extractor.track import Credit, ExtractorTrack
from trainer.models import default_model_path, load_tokenizer, prepare_default_models
from trainer.report import Progress
from trainer.rollout import make_engine
from trainer.store import Add, Generation

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "MiniHack-Room-5x5"
LESSONS = [
    ("Find the stairs", "Look for the > symbol on the map and walk toward it step by step."),
    ("Walls block moves", "A move into a wall does nothing; go around it through the floor tiles."),
    ("Read the compass", "The observation lists the stairs' direction; move in that compass direction."),
    ("Diagonal moves", "Northeast, southeast and the others move one tile diagonally at once."),
]


@pytest.fixture(scope="module")
def extractor():
    path = prepare_default_models(default_model_path())
    engine = make_engine("hf", path)
    yield Extractor(engine, load_tokenizer(path), max_new_tokens=24, temperature=1.0)
    engine.close()


def test_credits_submitted_during_a_merge_pass_are_taken_between_its_chunks(manager, extractor, monkeypatch):
    monkeypatch.setattr(manager, "merge_chunk", 2)
    written = Generation("prompt", "answer", (5, 6, 7), (-0.1, -0.2, -0.3), weight_version=0)
    results = manager.apply([Add(SCOPE, t, c, generation=written) for t, c in LESSONS], step=1)
    ids = [r.entry_id for r in results]
    track = ExtractorTrack(extractor, manager, CreditBuffer(8), scopes=[SCOPE])

    def finish_a_step(track):  # the actor finishes a step while πϕ plans the first chunk
        track.submit(2, [], [Credit(f"ep-{i}", i % 2 == 0, entry_id=i) for i in ids])

    credited_at_chunk = _merge_while_the_actor_goes_on(track, "credited", finish_a_step, monkeypatch)
    assert len(credited_at_chunk) >= 2  # the premise: the pass had more than one chunk
    assert credited_at_chunk[0] == 0 and credited_at_chunk[1] == len(ids)
    assert track.counts["credited_generations"] >= 1


def test_episodes_that_arrive_during_a_merge_pass_are_distilled_between_its_chunks(
    manager, extractor, monkeypatch
):
    monkeypatch.setattr(manager, "merge_chunk", 2)
    manager.apply([Add(SCOPE, t, c) for t, c in LESSONS], step=1)
    heard = Recorder()
    progress = Progress(heard, every_s=0, track="extractor")
    track = ExtractorTrack(extractor, manager, CreditBuffer(8), scopes=[SCOPE], progress=progress)

    def finish_a_step(track):  # the actor finishes a step, and asks for the next merge
        track.submit(2, [_episode(0), _episode(1)], [])
        track.request_merge(2)
        track.request_merge(3)  # a second request while the first still waits: the same pass

    distilled_at_chunk = _merge_while_the_actor_goes_on(track, "distilled", finish_a_step, monkeypatch)
    assert distilled_at_chunk[:2] == [0, 2]  # not after the whole pass
    assert track.counts["merges"] == 2 and track.counts["merges_coalesced"] == 1
    # what the run page heard from the track's thread: the pass's chunks counted up, the episodes that
    # arrived distilled in between (both of them), then the pass again where it had stopped
    phases = [e[2:4] for e in heard.events]
    assert phases[0] == ("extractor: merging", 0) and ("extractor: distilling", 2) in phases
    merging = [done for phase, done in phases if phase == "extractor: merging"]
    # counting up; 0: the next pass
    assert all(b >= a or b == 0 for a, b in itertools.pairwise(merging))
    assert merging.count(0) == track.counts["merges"] and max(merging) >= 1
    after = phases[phases.index(("extractor: distilling", 2)) + 1 :]
    assert after and after[0][0] == "extractor: merging"


def _merge_while_the_actor_goes_on(track, counter, during_first_chunk, monkeypatch) -> list[float]:
    """One merge pass on ``track`` whose first chunk runs ``during_first_chunk(track)``; returns
    ``track.counts[counter]`` as each chunk started."""
    at_chunk: list[float] = []
    real_merge = track.extractor.merge_fn

    def merge(chunk):
        at_chunk.append(track.counts[counter])
        if len(at_chunk) == 1:
            during_first_chunk(track)
        return real_merge(chunk)

    monkeypatch.setattr(track.extractor, "merge_fn", merge)
    try:
        track.request_merge(1)
        assert track.drain(timeout=600)
    finally:
        track.close(timeout=60)
    return at_chunk


def _episode(n: int) -> DistilRequest:
    steps = (Step("The stairs > are 2 tiles east of you.", "east"), Step("You are on the stairs.", "down"))
    return DistilRequest(f"1:task-{n}", SCOPE, "Go down the stairs.", steps, True, 1.0, step=1)


def test_a_resumed_track_does_the_checkpoints_unfinished_work_less_what_the_lost_one_finished(
    manager, extractor, monkeypatch, tmp_path
):
    written = Generation("prompt", "answer", (5, 6, 7), (-0.1, -0.2, -0.3), weight_version=0)
    [entry] = manager.apply([Add(SCOPE, *LESSONS[0], generation=written)], step=1)
    options = dict(scopes=[SCOPE], distil_batch=1, journal=tmp_path / "extractor_track.jsonl")
    distilled: list[str] = []
    real_distil = extractor.distil
    second_batch, checkpointed = threading.Event(), threading.Event()

    def distil_with_a_checkpoint_during_the_second_batch_and_die_after_it(requests):
        if distilled:
            second_batch.set()
            checkpointed.wait(600)  # the first batch is done, the second under way
        distilled.extend(r.episode_id for r in requests)
        results = real_distil(requests)
        if len(distilled) == 2:
            lost.cancel.set()  # the process is killed after its second batch
        return results

    monkeypatch.setattr(
        extractor, "distil", distil_with_a_checkpoint_during_the_second_batch_and_die_after_it
    )
    lost = ExtractorTrack(extractor, manager, CreditBuffer(8), **options)
    calls_before = extractor.stats.calls["distil"]
    try:
        lost.submit(
            1, [_episode(0), _episode(1), _episode(2)], [Credit("1:task-0", True, entry_id=entry.entry_id)]
        )
        assert second_batch.wait(600)
        with lost.update_lock:
            lost.settle_credits()
            state = lost.state_dict()
        checkpointed.set()
        assert lost.drain(timeout=600)
    finally:
        lost.close(timeout=60)
    assert distilled == ["1:task-0", "1:task-1"]  # the premise: one batch before the checkpoint, one after
    assert [len(item.requests) for item in state["unfinished"]] == [3]
    assert state["counts"]["credited"] == 1 and not state["pending_credits"]  # credited once, in the buffer
    assert state["counts"]["distilled"] == 1  # the batch under way is not the checkpoint's yet
    assert state["extractor_stats"]["calls"]["distil"] == calls_before + 1

    resumed = _resume(extractor, manager, state, options)
    # the lost batch once; the finished ones not again
    assert distilled == ["1:task-0", "1:task-1", "1:task-2"]
    # counted as if never killed: the batch finished after the checkpoint from the journal, none twice
    assert resumed.counts["distilled"] == 3 and resumed.counts["credited"] == 1
    assert extractor.stats.calls["distil"] == calls_before + 3
    assert len(resumed.buffer.pending) == 1  # the credit came back with the buffer, not twice
    assert resumed.state_dict()["unfinished"] == []


def test_a_merge_pass_finished_after_the_checkpoint_is_counted_by_the_resumed_track_not_done_again(
    manager, extractor, monkeypatch, tmp_path
):
    monkeypatch.setattr(manager, "merge_chunk", 2)
    manager.apply([Add(SCOPE, t, c) for t, c in LESSONS], step=1)
    options = dict(scopes=[SCOPE], journal=tmp_path / "extractor_track.jsonl")
    lost = ExtractorTrack(extractor, manager, CreditBuffer(8), **options)
    states = []

    def checkpoint_during_the_first_chunk(track):
        with track.update_lock:
            track.settle_credits()
            states.append(track.state_dict())

    merge_calls_before = extractor.stats.calls["merge"]
    chunks = _merge_while_the_actor_goes_on(lost, "merges", checkpoint_during_the_first_chunk, monkeypatch)
    [state] = states
    assert len(chunks) >= 2 and lost.counts["merges"] == 1  # the premise: the pass ended after the checkpoint
    assert [type(item).__name__ for item in state["unfinished"]] == ["_Merge"]
    assert (
        state["counts"].get("merges", 0) == 0
        and state["extractor_stats"]["calls"].get("merge", 0) == merge_calls_before
    )

    passes, real_merge = [], manager.merge
    monkeypatch.setattr(manager, "merge", lambda *a, **k: passes.append(a) or real_merge(*a, **k))
    resumed = _resume(extractor, manager, state, options)
    assert passes == []  # not done again
    for name in ("merges", "merge_chunks", "merge_removed", "merge_created", "merge_unparseable"):
        assert resumed.counts[name] == lost.counts[name], name
    assert extractor.stats.calls["merge"] == merge_calls_before + len(chunks)
    assert resumed._merge_keys == lost._merge_keys  # its entries are credited as merges


def test_a_batch_the_lost_track_committed_but_never_journaled_adds_no_entry_twice(
    manager, extractor, monkeypatch, tmp_path
):
    """The process dies between the bank's commit of a distillation batch and the journal line that says
    so: the resumed track does the batch again (its extractor may well write the same text), and the bank
    keeps one copy of what it added."""
    options = dict(scopes=[SCOPE], distil_batch=1, journal=tmp_path / "extractor_track.jsonl")
    real_distil = extractor.distil

    def always_a_lesson(requests):  # the untrained extractor's answer may not parse: one Add per episode
        return [
            dataclasses.replace(r, ops=[Add(SCOPE, f"Lesson of {r.request.episode_id}", LESSONS[0][1])])
            for r in real_distil(requests)
        ]

    monkeypatch.setattr(extractor, "distil", always_a_lesson)
    lost = ExtractorTrack(extractor, manager, CreditBuffer(8), **options)
    began, checkpointed = threading.Event(), threading.Event()
    real_begin = lost._begin

    def checkpoint_before_the_batch(job):
        began.set()
        checkpointed.wait(600)
        real_begin(job)

    def killed_before_the_journal_line(key, finished=None):
        raise SystemExit("killed")  # the track thread ends here, after the bank's commit

    monkeypatch.setattr(lost, "_begin", checkpoint_before_the_batch)
    monkeypatch.setattr(lost.journal, "record", killed_before_the_journal_line)
    try:
        lost.submit(1, [_episode(0)], [])
        assert began.wait(600)
        with lost.update_lock:
            lost.settle_credits()
            state = lost.state_dict()
        checkpointed.set()
        wait_for(lambda: manager.size() == 1, 600, "the lost batch's commit")
    finally:
        lost.close(timeout=60)
    assert [len(item.requests) for item in state["unfinished"]] == [1]  # the premise: checkpointed unfinished

    resumed = _resume(extractor, manager, state, options)
    assert resumed.counts["distilled"] == 1 and resumed.counts["ops_applied"] == 1  # counted once
    assert manager.size() == 1  # added once
    assert Experience.objects.filter(run=manager.run_id).count() == 1


def _resume(extractor, manager, state, options) -> ExtractorTrack:
    """A track that loads ``state`` (a checkpoint's) and finishes its work."""
    resumed = ExtractorTrack(extractor, manager, CreditBuffer(8), **options)
    try:
        resumed.load_state_dict(state)
        assert resumed.drain(timeout=600)
    finally:
        resumed.close(timeout=60)
    return resumed

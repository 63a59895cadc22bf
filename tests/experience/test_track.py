"""The extractor's background track over the real bank, the real SmolLM2 extractor and its engine: credits
submitted while a merge pass runs are taken in between its chunks, not after the whole pass."""

from __future__ import annotations

import pytest

from trainer.extractor.credit import CreditBuffer
from trainer.extractor.model import Extractor
from trainer.extractor.track import Credit, ExtractorTrack
from trainer.models import default_model_path, load_tokenizer, prepare_default_models
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
    credited_at_chunk: list[float] = []
    real_merge = extractor.merge_fn

    def merge_while_the_actor_goes_on(chunk):
        credited_at_chunk.append(track.counts["credited"])
        if len(credited_at_chunk) == 1:  # the actor finishes a step while πϕ plans the first chunk
            track.submit(2, [], [Credit(f"ep-{i}", i % 2 == 0, entry_id=i) for i in ids])
        return real_merge(chunk)

    monkeypatch.setattr(extractor, "merge_fn", merge_while_the_actor_goes_on)
    try:
        track.request_merge(1)
        assert track.drain(timeout=600)
    finally:
        track.close(timeout=60)
    assert len(credited_at_chunk) >= 2  # the premise: the pass had more than one chunk
    assert credited_at_chunk[0] == 0 and credited_at_chunk[1] == len(ids)
    assert track.counts["credited_generations"] >= 1

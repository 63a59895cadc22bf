"""The process-wide embedder's warm start."""

from __future__ import annotations

import threading
import time

from experience import embedding


def test_the_warm_up_runs_its_follow_up_once_the_model_has_loaded_and_only_once(monkeypatch):
    happened = []
    monkeypatch.setattr(embedding, "_default", None)
    monkeypatch.setattr(embedding, "_warm_up", None)
    monkeypatch.setattr(embedding, "default_embedder", lambda: happened.append("model loaded"))
    done = threading.Event()

    def then() -> None:
        happened.append("then")
        done.set()

    embedding.warm_up_in_background(then=then)
    embedding.warm_up_in_background(then=then)  # already under way: starts nothing
    assert done.wait(10)
    embedding._warm_up.join(10)
    assert happened == ["model loaded", "then"]


def _texts(n: int, tag: str) -> list[str]:
    return [f"{tag}: walk around boulder {i} and take the stairs down" for i in range(n)]


def test_a_low_priority_batch_that_had_to_wait_is_followed_by_a_pause_of_its_share():
    """A batch that spent its time waiting (here for the real model, held by another search for 1 s) was
    competing for the CPU: the embedder gives way, pausing so that it embeds at most ``share`` of the wall
    time, saying it is alive meanwhile; the next batch that runs at once ends the giving way."""
    model = embedding.default_embedder()
    beats, gave_way = [], []
    with embedding.LowPriorityEmbedder(  # at the test's own priority: only the held model makes it wait
        model, 0, share=0.25, heartbeat=lambda: beats.append(time.monotonic()), every_s=0.2,
        giving_way=gave_way.append,
    ) as low:  # fmt: skip
        with model._encode_lock:
            began = time.monotonic()
            batch = threading.Thread(target=low.embed, args=(_texts(8, "waits"),), kwargs={"cache": False})
            batch.start()
            time.sleep(1.0)
        batch.join(30)
        waited = time.monotonic() - began
        assert gave_way == [True]
        assert waited >= 1.0 * (1 + 3) * 0.95  # the 1 s batch, then a pause of 3 s (share 1/4)
        assert len([b for b in beats if b > began + 1.0]) >= 10  # alive through the pause
        low.embed(_texts(64, "runs"), cache=False)
    assert gave_way == [True, False]


def test_a_low_priority_embedder_never_pauses_when_its_batches_run_at_once():
    model = embedding.default_embedder()
    gave_way = []
    with embedding.LowPriorityEmbedder(model, 0, share=0.25, giving_way=gave_way.append) as low:
        began = time.monotonic()
        for i in range(3):
            low.embed(_texts(64, f"idle {i}"), cache=False)
        took = time.monotonic() - began
    assert gave_way == []
    alone = time.monotonic()
    model.embed(_texts(64, "alone"), cache=False)
    assert took < 3 * (time.monotonic() - alone) * 3  # no pause of 3× each batch

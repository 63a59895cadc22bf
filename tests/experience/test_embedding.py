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
    """A batch that spent its time waiting (here for the real model, held by another search for 0.6 s) was
    competing for the CPU: the embedder gives way, pausing so that it embeds at most ``share`` of the wall
    time, saying it is alive meanwhile."""
    model = embedding.default_embedder()
    beats, gave_way = [], []
    with embedding.LowPriorityEmbedder(  # at the test's own priority: only the held model makes it wait
        model, 0, share=0.5, heartbeat=lambda: beats.append(time.monotonic()), every_s=0.2,
        giving_way=gave_way.append,
    ) as low:  # fmt: skip
        with model._encode_lock:
            began = time.monotonic()
            batch = threading.Thread(target=low.embed, args=(_texts(8, "waits"),), kwargs={"cache": False})
            batch.start()
            time.sleep(0.6)
        batch.join(30)
        waited = time.monotonic() - began
    assert gave_way == [True]
    wall, cpu = low.last_batch
    assert wall >= 0.6 and cpu < wall / 2
    assert waited >= 2 * wall * 0.95  # the batch, then a pause as long (share 1/2)
    assert len([b for b in beats if b > began + wall]) >= 3  # alive through the pause


def test_a_batch_that_had_a_core_to_itself_is_not_followed_by_a_pause():
    """Whatever else the machine runs meanwhile, a batch pauses exactly when its thread got less than half a
    core, for ``(1 - share) / share`` of its wall time, and the giving way follows the last batch."""
    model = embedding.default_embedder()
    gave_way = []
    with embedding.LowPriorityEmbedder(model, 0, share=0.25, giving_way=gave_way.append) as low:
        for i in range(3):
            began = time.monotonic()
            low.embed(_texts(64, f"batch {i}"), cache=False)
            took = time.monotonic() - began
            wall, cpu = low.last_batch
            contended = cpu < wall / 2
            assert low.gave_way == contended
            if contended:
                assert took >= 4 * wall * 0.95
            else:
                assert took < wall + 0.5  # no pause of three times the batch

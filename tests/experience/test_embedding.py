"""The process-wide embedder's warm start."""

from __future__ import annotations

import threading

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

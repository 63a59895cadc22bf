"""Cancellation that reaches a run within seconds, not at the end of a step.

Something outside the loop (the webapp's run monitor, a signal handler) sets a ``CancelToken``; the trainer
calls ``check()`` at its cancellation points: between rollout turns (training and evaluation episodes
alike), between the actor's and the extractor's micro-batches, and between the extractor track's items.
``check()`` raises ``Cancelled``, which unwinds the loop (engines and environments are closed on the way
out) without evaluating or checkpointing: the run keeps its last checkpoint. The longest wait is one engine
call already under way.
"""

from __future__ import annotations

import threading


class Cancelled(Exception):
    """The run was asked to stop."""


class CancelToken:
    """A flag set once from any thread and checked by the trainer."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise ``Cancelled`` if the run was asked to stop."""
        if self._event.is_set():
            raise Cancelled("the run was asked to stop")

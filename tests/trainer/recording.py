"""A reporter that keeps what a training loop reports, for tests that train for real."""

from __future__ import annotations

from trainer.report import BaseReporter


class Recorder(BaseReporter):
    def __init__(self, stop_after: int | None = None) -> None:
        self.steps: dict[int, dict[str, float]] = {}
        self.evals: dict[int, dict[str, float]] = {}
        self.batches: dict[int, list] = {}
        self.eval_batches: dict[int, list] = {}
        self.events: list[tuple] = []
        """What arrived, in order: ("progress", step, phase, done, total), ("step", step), ("eval", step),
        ("eval episodes", step)."""
        self.stop_after = stop_after

    def on_step(self, step, metrics):
        self.steps[step] = dict(metrics)
        self.events.append(("step", step))

    def on_eval(self, step, metrics):
        self.evals[step] = dict(metrics)
        self.events.append(("eval", step))

    def on_progress(self, step, progress):
        self.events.append(("progress", step, progress["phase"], progress["done"], progress["total"]))

    def on_episode_batch(self, step, episodes):
        self.batches[step] = list(episodes)

    def on_eval_episodes(self, step, episodes):
        self.eval_batches[step] = list(episodes)
        self.events.append(("eval episodes", step))

    def should_stop(self):
        return self.stop_after is not None and max(self.steps, default=0) >= self.stop_after

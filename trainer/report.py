"""Progress reporting: the protocol the training loop talks to, and plain implementations.

The loop never knows where progress goes. The webapp plugs in a reporter that writes metric rows and
broadcasts them; a script uses ``ConsoleReporter`` (a progress bar and per-step metrics) and
``JsonlReporter`` (one JSON object per line, easy to plot or tail). ``should_stop`` is how a
cancellation reaches the loop: it is asked between steps.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainer.runfiles import episode_batch, read_lines, write_lines

if TYPE_CHECKING:
    from trainer.rollout.runner import Episode


@runtime_checkable
class Reporter(Protocol):
    """Receives a run's progress. Metrics are flat ``{"name": float}`` dicts."""

    def on_start(self, total_steps: int, start_step: int) -> None:
        """The loop starts (or resumes) at ``start_step`` (1-based) of ``total_steps``."""

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Actor step ``step`` finished."""

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """An evaluation after step ``step`` (0: the untrained model) finished."""

    def on_episode_batch(self, step: int, episodes: Sequence[Episode]) -> None:
        """The episodes of step ``step`` (full turn lists, for trajectory views)."""

    def should_stop(self) -> bool:
        """True to end the run cleanly after the current step (it is checkpointed)."""
        return False


class RunClock:
    """Seconds a run has trained, across resumes: a resumed run starts from the seconds its checkpoint
    saved (``CheckpointState.elapsed_s``), so its wall times keep increasing in step order however often it
    was interrupted. The loop saves it in each checkpoint; a reporter that stamps wall times shares it, so a
    row is never stamped later than the checkpoint that follows it. Time an interrupted attempt spent after
    its last checkpoint is not counted: its steps are redone and recorded again."""

    def __init__(self, elapsed_s: float = 0.0) -> None:
        self.started = time.monotonic() - elapsed_s

    def __call__(self) -> float:
        return time.monotonic() - self.started


class BaseReporter:
    """A reporter that does nothing; subclass and override what you need."""

    def on_start(self, total_steps: int, start_step: int) -> None:
        pass

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def on_episode_batch(self, step: int, episodes: Sequence[Episode]) -> None:
        pass

    def on_trace(self, step: int, trace: Mapping[str, Any]) -> None:
        """A Search-and-Ask exchange of step ``step`` (query, entry, answer, episode, turn); optional: the
        loop calls it only on reporters that have it (``trainer.coevolution.on_trace``)."""

    def on_progress(self, step: int, progress: Mapping[str, Any]) -> None:
        """Where step ``step`` is inside a long phase (``Progress.snapshot``); optional, like ``on_trace``."""

    def on_eval_episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """The episodes of the evaluation after step ``step``, both columns (an episode's ``spec.guided``:
        of the with-experience column), just before its ``on_eval``; optional, like ``on_trace``."""

    def should_stop(self) -> bool:
        return False


class Progress:
    """Where a run is inside a phase that takes a while (evaluation, rollouts, the actor update): the
    phase, ``done`` of ``total`` units, the seconds since the phase began and an estimate of those left.

    The loop calls ``start`` when a phase begins and ``advance`` as units finish; reporters that take it
    (``on_progress``) get a snapshot at the phase's start, at most every ``every_s`` seconds meanwhile, and
    when its last unit finishes, so a ten-minute evaluation is never a silent "step 0 of 3"."""

    def __init__(self, reporter: Reporter | None, every_s: float = 2.0, *, track: str = "") -> None:
        """``track``: whose phases these are when not the actor loop's (``"extractor"``: πϕ's background
        work, which runs beside the loop's phases and is shown beside them)."""
        self.reporter = reporter
        self.every_s = every_s
        self.track = track
        self.step, self.phase, self.unit = 0, "", ""
        self.done, self.total = 0, 0
        self.started = self.sent = 0.0

    def start(self, step: int, phase: str, unit: str = "", total: int = 0, done: int = 0) -> None:
        """A phase begins (``done``: units of it already finished, for a phase taken up again)."""
        self.step, self.phase, self.unit, self.done, self.total = step, phase, unit, done, total
        self.turn, self.turns = 0, 0
        self.started = time.monotonic()
        self._send()

    def advance(self, done: int, total: int | None = None, turn: int = 0, turns: int = 0) -> None:
        """``done`` units of ``total`` (the phase's, unless given) have finished; a rollout also says the
        ``turn`` its episodes, played together, have reached of at most ``turns``, so that a batch whose
        episodes all end at its turn limit still moves on the page."""
        if total is not None:
            self.total = total
        if done == self.done and turn == self.turn:
            return
        self.done, self.turn, self.turns = done, turn, turns
        if (self.total and done >= self.total) or time.monotonic() - self.sent >= self.every_s:
            self._send()

    def snapshot(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        snapshot = {"phase": self.phase, "unit": self.unit, "done": self.done, "total": self.total,
                    "elapsed_s": round(elapsed, 1), "eta_s": self._seconds_left(elapsed)}  # fmt: skip
        if self.turns:
            snapshot |= {"turn": self.turn, "turns": self.turns}
        return snapshot | ({"track": self.track} if self.track else {})

    def _seconds_left(self, elapsed: float) -> float | None:
        """From the turns when the phase plays episodes together (at most: a turn costs less as its episodes
        end), else from the units done; None before either has a rate."""
        if self.turns and self.turn and self.done < self.total:
            return round(elapsed / self.turn * (self.turns - self.turn), 1)
        if self.done and self.total:
            return round(elapsed / self.done * (self.total - self.done), 1)
        return None

    def _send(self) -> None:
        self.sent = time.monotonic()
        report_progress(self.reporter, self.step, self.snapshot())


def report_progress(reporter: Reporter | None, step: int, progress: Mapping[str, Any]) -> None:
    """Hand ``progress`` to a reporter that takes it (``on_progress``); others skip it."""
    hook = getattr(reporter, "on_progress", None)
    if hook is not None:
        hook(step, progress)


def report_eval_episodes(reporter: Reporter | None, step: int, episodes: Sequence[Episode]) -> None:
    """Hand an evaluation's episodes to reporters that take them (``on_eval_episodes``); others skip them."""
    hook = getattr(reporter, "on_eval_episodes", None)
    if hook is not None:
        hook(step, episodes)


class Reporters(BaseReporter):
    """Several reporters as one; stops when any of them asks to."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def on_start(self, total_steps: int, start_step: int) -> None:
        for r in self.reporters:
            r.on_start(total_steps, start_step)

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        for r in self.reporters:
            r.on_step(step, metrics)

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        for r in self.reporters:
            r.on_eval(step, metrics)

    def on_episode_batch(self, step: int, episodes: Sequence[Episode]) -> None:
        for r in self.reporters:
            r.on_episode_batch(step, episodes)

    def on_trace(self, step: int, trace: Mapping[str, Any]) -> None:
        for r in self.reporters:
            hook = getattr(r, "on_trace", None)
            if hook is not None:
                hook(step, trace)

    def on_progress(self, step: int, progress: Mapping[str, Any]) -> None:
        for r in self.reporters:
            report_progress(r, step, progress)

    def on_eval_episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        for r in self.reporters:
            report_eval_episodes(r, step, episodes)

    def should_stop(self) -> bool:
        return any(r.should_stop() for r in self.reporters)


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = round(width * done / max(total, 1))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class ConsoleReporter(BaseReporter):
    """One line per step and per evaluation: a progress bar, the key metrics and the time breakdown."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.total = 0
        self.started = time.perf_counter()

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def on_start(self, total_steps: int, start_step: int) -> None:
        self.total = total_steps
        self.started = time.perf_counter()
        if start_step > total_steps:  # it died after its last step (trainer.coevolution.work_left)
            self._print(f"training: all {total_steps} steps done; finishing the extractor's queued work")
            return
        where = "starting" if start_step == 1 else f"resuming at step {start_step}"
        self._print(f"training: {where} of {total_steps}")

    def on_step(self, step: int, m: Mapping[str, float]) -> None:
        g = m.get
        self._print(
            f"{_bar(step, self.total)} step {step}/{self.total} | "
            f"success {g('train/success', 0):.2f} reward {g('train/reward', 0):.2f} "
            f"actions {g('train/actions', 0):.1f} invalid {g('train/invalid_frac', 0):.2f} | "
            f"loss {g('actor/loss', 0):+.4f} clip {g('actor/clip_frac', 0):.3f} "
            f"kl {g('actor/approx_kl', 0):.2e} "
            f"gnorm {g('actor/grad_norm', 0):.2f} | {g('rollout/tokens_per_s', 0):.0f} tok/s | "
            f"{g('time/step_s', 0):.1f}s = rollout {g('time/rollout_s', 0):.1f} + recompute "
            f"{g('time/recompute_s', 0):.1f} + backward {g('time/backward_s', 0):.1f} "
            f"+ sync {g('time/sync_s', 0):.2f}"
        )

    def on_eval(self, step: int, m: Mapping[str, float]) -> None:
        parts = [f"{k.removeprefix('eval/')} {v:.3f}" for k, v in m.items() if k.startswith("eval/")]
        self._print(f"eval after step {step}: " + ", ".join(parts))


def redone_on_resume(row: Mapping[str, Any], start_step: int) -> bool:
    """Whether an attempt that starts at ``start_step`` writes ``row`` again: every step from there on and
    the evaluations after them; starting over (step 1), the untrained model's evaluation (step 0) too."""
    return start_step <= 1 or int(row["step"]) >= start_step


def drop_redone(path: Path, start_step: int) -> list[dict[str, Any]]:
    """Remove from the log at ``path`` the rows an attempt starting at ``start_step`` writes again; the
    rows kept."""
    rows = read_lines(path)
    kept = [r for r in rows if not redone_on_resume(r, start_step)]
    if len(kept) < len(rows):
        write_lines(path, kept)
    return kept


class JsonlReporter(BaseReporter):
    """Writes ``{"kind": "step"|"eval", "step": n, ...metrics}`` lines to ``path``, each (kind, step) once.

    A resumed run redoes the steps after its checkpoint: ``on_start`` drops the rows the lost attempt
    wrote for them, and a row replaces an earlier one of its (kind, step) (the finishing pass of a run
    that died after its last step writes that step's row again), so the file never holds two attempts.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._keys = {_row_key(r) for r in read_lines(self.path)}

    def on_start(self, total_steps: int, start_step: int) -> None:
        self._keys = {_row_key(r) for r in drop_redone(self.path, start_step)}

    def _write(self, kind: str, step: int, metrics: Mapping[str, float]) -> None:
        if (kind, step) in self._keys:
            write_lines(self.path, [r for r in read_lines(self.path) if _row_key(r) != (kind, step)])
        with self.path.open("a") as f:
            f.write(json.dumps({"kind": kind, "step": step, "time": time.time(), **metrics}) + "\n")
        self._keys.add((kind, step))

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._write("step", step, metrics)

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        self._write("eval", step, metrics)


def _row_key(row: Mapping[str, Any]) -> tuple[str, int]:
    return row.get("kind", ""), int(row["step"])


class EpisodeLogReporter(BaseReporter):
    """Writes one compact line per episode to ``path`` (no turns), each batch once: a training step's
    episodes, and an evaluation's (``"eval": true``; ``guided`` is then its column, with experience). What
    experiment reports need to relate outcomes to the entries that guided them, without the database. Like
    ``JsonlReporter``, a resumed attempt first drops the batches of the steps and evaluations it redoes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._batches = {episode_batch(r) for r in read_lines(self.path)}

    def on_start(self, total_steps: int, start_step: int) -> None:
        self._batches = {episode_batch(r) for r in drop_redone(self.path, start_step)}

    def on_episode_batch(self, step: int, episodes: Sequence[Episode]) -> None:
        self._write(step, episodes, evaluation=False)

    def on_eval_episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        self._write(step, episodes, evaluation=True)

    def _write(self, step: int, episodes: Sequence[Episode], *, evaluation: bool) -> None:
        batch = (evaluation, step)
        if batch in self._batches:
            write_lines(self.path, [r for r in read_lines(self.path) if episode_batch(r) != batch])
        with self.path.open("a") as f:
            for e in episodes:
                f.write(json.dumps(episode_line(step, e, evaluation=evaluation)) + "\n")
        self._batches.add(batch)


def episode_line(step: int, e: Episode, *, evaluation: bool = False) -> dict[str, Any]:
    """An episode's outcome and the entry that guided it (``entry_id`` None: free or nothing found);
    ``eval``: played by the evaluation after ``step``, not by the step's training."""
    x = e.experience
    return {
        "step": step,
        "eval": evaluation,
        "env": e.spec.env_name,
        "seed": e.spec.seed,
        "group": e.spec.group,
        "guided": e.spec.guided,
        "sample_seed": e.spec.sample_seed,
        "entry_id": x.entry_id if x else None,
        "entry_version": x.entry_version if x else None,
        "similarity": x.similarity if x else None,
        "success": e.success,
        "reward": e.reward,
        "actions": e.num_actions,
        "searches": sum(t.intercepted for t in e.turns),
    }

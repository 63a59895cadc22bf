"""The one progress path of a run: durable rows first, then a small live event to the run's group.

``RunReporter`` plugs into the trainer's ``Reporter`` protocol (trainer/report.py). Rows are the
record and the replay cursor: a browser that connects late catches up from them (see
``selectors.metric_rows_since``), so a lost broadcast loses nothing.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import psutil
from django.db import connection, transaction
from django.utils import timezone

from trainer.cancel import CancelToken
from trainer.report import BaseReporter, RunClock
from webapp.events import broadcast_run_event
from webapp.models import HEARTBEAT_INTERVAL_S, EpisodeRecord, MetricRow, Run
from webapp.selectors import metric_event

log = logging.getLogger(__name__)

VERSION_METRICS = {"actor_version": "engine/weight_version", "extractor_version": "extractor/weight_version"}
"""Run fields kept equal to the weight versions the loop reports."""


def _finite(values: Mapping[str, float]) -> dict[str, float | None]:
    """JSON has no NaN/inf: store them as null so one bad number cannot lose a row."""
    return {k: (float(v) if math.isfinite(float(v)) else None) for k, v in values.items()}


class RunReporter(BaseReporter):
    """Writes a run's metrics and episodes to PostgreSQL, beats its heartbeat, relays cancellation.

    Rows are stamped by ``clock``, the run's: shared with its training loop, which saves it in each
    checkpoint, so a resumed run's wall times go on from where its checkpoint left them."""

    def __init__(self, run: Run, clock: RunClock | None = None) -> None:
        self.run = run
        self.clock = clock or RunClock()

    def _beat(self, **fields: Any) -> None:
        Run.objects.filter(pk=self.run.pk).update(heartbeat_at=timezone.now(), **fields)

    def _record(self, kind: str, step: int, metrics: Mapping[str, float]) -> None:
        values = {"values": _finite(metrics), "wall_time": self.clock()}
        row, _ = MetricRow.objects.update_or_create(run=self.run, kind=kind, step=step, defaults=values)
        self._broadcast(metric_event(row))

    def _broadcast(self, event: dict) -> None:
        try:
            broadcast_run_event(self.run.pk, event)
        except Exception:  # noqa: BLE001 - the row is written; live viewers catch up from it
            log.warning("run %s: live event not delivered", self.run.pk, exc_info=True)

    def on_start(self, total_steps: int, start_step: int) -> None:
        self._beat()
        self._broadcast({"kind": "status", "status": Run.Status.RUNNING})

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._record(MetricRow.Kind.TRAIN, step, metrics)
        versions = {field: int(metrics[key]) for field, key in VERSION_METRICS.items() if key in metrics}
        self._beat(step=step, **versions)

    def on_eval(self, step: int, metrics: Mapping[str, float]) -> None:
        self._record(MetricRow.Kind.EVAL, step, metrics)
        self._beat()

    def on_episode_batch(self, step: int, episodes: Sequence[Any]) -> None:
        EpisodeRecord.objects.bulk_create(episode_record(self.run, step, ep) for ep in episodes)

    def on_eval_episodes(self, step: int, episodes: Sequence[Any]) -> None:
        """The evaluation's episodes, both columns: each evaluation's once, as its metric row."""
        kind = EpisodeRecord.Kind.EVAL
        rows = [episode_record(self.run, step, ep, kind) for ep in episodes]
        with transaction.atomic():
            EpisodeRecord.objects.filter(run=self.run, kind=kind, step=step).delete()
            EpisodeRecord.objects.bulk_create(rows)

    def on_progress(self, step: int, progress: Mapping[str, Any]) -> None:
        """Stored on the run (its page and the API read it) and sent live; a beat, since the run is alive.

        The loop's phase is the progress itself; a track's (the extractor's, from its own thread) is kept
        under its name beside it. Both are merged into the stored JSON in one statement, so neither thread
        overwrites what the other wrote."""
        snapshot = {"step": step, **progress, "at": round(time.time(), 1)}  # a page catches up from "at"
        patch = {progress["track"]: snapshot} if progress.get("track") else snapshot
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Run._meta.db_table} SET progress = progress || %s::jsonb, heartbeat_at = %s "
                "WHERE id = %s",
                [json.dumps(patch), timezone.now(), self.run.pk],
            )
        self._broadcast({"kind": "progress", **snapshot})

    def on_trace(self, step: int, trace: Mapping[str, Any]) -> None:
        self._broadcast({"kind": "trace", "step": step, **{k: str(v)[:2000] for k, v in trace.items()}})

    def should_stop(self) -> bool:
        """Beats; a cancel reaches the loop sooner, through the token ``Heartbeat`` sets."""
        self._beat()
        return False


def episode_record(run: Run, step: int, ep: Any, kind: str = EpisodeRecord.Kind.TRAIN) -> EpisodeRecord:
    experience = ep.experience
    return EpisodeRecord(
        run=run,
        step=step,
        kind=kind,
        task_instance=ep.spec.group,
        env=ep.spec.env_name,
        seed=ep.spec.seed,
        guided=ep.spec.guided,
        experience_id=getattr(experience, "entry_id", None),
        injected_experience=getattr(experience, "text", "") or "",
        reward=float(ep.reward),
        success=bool(ep.success),
        num_actions=ep.num_actions,
        turns=[asdict(t) for t in ep.turns],
        actor_version=max(ep.weight_versions, default=0),
    )


def tree_rss_mb(process: psutil.Process | None = None) -> float:
    """Resident memory of a process and all its children (engine processes), in MB."""
    process = process or psutil.Process()
    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # it ended meanwhile
            continue
    return total / 2**20


class Heartbeat:
    """Watches a training run from a thread, however long a step takes: beats its heartbeat every
    ``interval`` seconds and stores the peak memory of this process tree on it; with a ``cancel`` token,
    polls the run's cancel request every ``poll`` seconds and sets the token (``trainer.cancel``).

    Steps on CPU can take minutes; beating only between steps made live runs look lost and let a
    redelivered task (Redis redelivers unacknowledged tasks after its visibility timeout) claim a run
    that was still training; asking for a cancel only between steps made a cancel take a whole step.
    """

    def __init__(
        self,
        run_id: int,
        interval: float = HEARTBEAT_INTERVAL_S,
        *,
        cancel: CancelToken | None = None,
        poll: float = 1.0,
    ) -> None:
        self.run_id = run_id
        self.interval = interval
        self.cancel = cancel
        self.poll = min(poll, interval)
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{run_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        next_beat = time.monotonic() + self.interval
        try:
            while not self._stop.wait(self.poll):
                self.peak_mb = max(self.peak_mb, tree_rss_mb())
                beat = time.monotonic() >= next_beat
                if beat:
                    next_beat += self.interval
                try:
                    self._watch(beat)
                except Exception:  # noqa: BLE001 - a missed beat is retried; the run goes on
                    log.warning("run %s: heartbeat not written", self.run_id, exc_info=True)
                    connection.close_if_unusable_or_obsolete()
            self._record_peak()  # the run's end: its peak, however short the run was
        finally:
            connection.close()

    def _record_peak(self) -> None:
        try:
            Run.objects.filter(pk=self.run_id).update(peak_rss_mb=round(self.peak_mb) or None)
        except Exception:  # noqa: BLE001 - a statistic; the run's outcome does not depend on it
            log.warning("run %s: peak memory not written", self.run_id, exc_info=True)

    def _watch(self, beat: bool) -> None:
        runs = Run.objects.filter(pk=self.run_id)
        watching = self.cancel is not None and not self.cancel.is_set()
        if watching and runs.filter(cancel_requested=True).exists():
            self.cancel.set()
        if beat:
            runs.update(heartbeat_at=timezone.now(), peak_rss_mb=round(self.peak_mb))

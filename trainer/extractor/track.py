"""The background extractor track of the asynchronous dual loop (docs/design.md §3.4).

The actor's loop hands each step's finished episodes to ``ExtractorTrack.submit`` and asks for merges with
``request_merge``; both only queue an item and return. One background thread does the work:

1. credits: guided outcomes go to the store's counters and, through the generation behind each entry
   (and the episode's Search-and-Ask refinements), into the credit buffer;
2. distillation: episodes go to πϕ in batches; its operations are applied through the store (which takes
   its own write lock);
3. merges: each scope's bank through ``store.merge`` with πϕ as the merge function;
4. training: whenever the buffer is full (and the actor is past warm-up), one CISPO step, then πϕ's
   engine is synced and its weight version bumped.

Nothing waits behind a merge pass. Episodes are distilled before any waiting merge, and before every chunk of
a running one the thread takes the credits submitted so far, trains if the buffer is full, and distils the
episodes that arrived meanwhile. A pass over a large bank is dozens of sequential πϕ calls (78 and 100, for
more than five actor steps, at ~300 entries in a grid cell here); everything queued behind it used to stall
for as long, and the bank stopped growing. A merge requested while another still waits to start is the
same pass (it reads the bank when it starts), so it is counted and dropped (``merges_coalesced``).

An exception on the thread stops the track and is raised again on the actor's side at its next call, so a
failure (a stale engine above all) is loud, never silent.

A killed or stopped run loses none of the work it had queued: a checkpoint credits what was submitted and
keeps the unfinished items (episodes to distil, merges), and the track writes each distillation batch and
merge it finishes to a journal (``TrackJournal``), with what it counted. A run resumed from the checkpoint
does the items again, less the batches the journal says the lost process finished after the checkpoint, and
counts those from the journal: its figures are the ones an uninterrupted run would report.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.cancel import Cancelled, CancelToken
from trainer.extractor.credit import Batch, CreditBuffer, generation_key
from trainer.extractor.model import DistilRequest, Extractor, job_counts
from trainer.extractor.update import ExtractorUpdate
from trainer.memory import release_freed_memory
from trainer.metrics import Metrics
from trainer.report import Progress
from trainer.store import ExperienceStore, Generation, GuidedOutcome


class TrackFailed(RuntimeError):
    """The background extractor track stopped on an error (the cause is chained)."""


@dataclass(frozen=True)
class Credit:
    """One outcome to credit: to the generation behind ``entry_id`` or to ``generation`` itself."""

    episode_id: str
    success: bool
    entry_id: int | None = None
    entry_version: int | None = None
    """The version of the entry the episode saw (None: whatever it is now)."""
    generation: Generation | None = None
    """A Search-and-Ask refinement of the episode (credited directly)."""


@dataclass(frozen=True)
class _Episodes:
    key: str
    """Unique across a run's attempts: journal keys are ``key/<first request's index>``."""
    step: int
    requests: tuple[DistilRequest, ...]


@dataclass(frozen=True)
class _Merge:
    key: str
    step: int


@dataclass(frozen=True)
class Finished:
    """One journaled piece of work: what it added to the track's and to πϕ's counters, and the generation
    keys of the merged entries it wrote."""

    counts: dict
    stats: dict
    merge_keys: tuple[str, ...] = ()


class TrackJournal:
    """The work the track finished, one JSON line each in ``path`` (None: in memory only).

    A checkpoint lists the track's unfinished items; the lost process may have finished some of them after
    that checkpoint, and the bank (the database) kept what it did. The journal is how the resumed run knows,
    and what that work counted.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.finished = self._read()

    @property
    def done(self):
        """The keys of the finished work (a set-like view)."""
        return self.finished.keys()

    def _read(self) -> dict[str, Finished]:
        if self.path is None or not self.path.exists():
            return {}
        finished = {}
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
                finished[row["done"]] = Finished(
                    row.get("counts", {}), row.get("stats", {}), tuple(row.get("merge_keys", ()))
                )
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a line torn by the kill: that work is done again
        return finished

    def record(self, key: str, finished: Finished | None = None) -> None:
        finished = self.finished[key] = finished or Finished({}, {})
        if self.path is None:
            return
        row = {"done": key, "counts": finished.counts, "stats": finished.stats}
        if finished.merge_keys:
            row["merge_keys"] = list(finished.merge_keys)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _item_of(journal_key: str) -> str:
    """The item a journal key belongs to (a distillation batch's key is ``<item key>/<first index>``)."""
    return journal_key.split("/", 1)[0]


MERGING = "extractor: merging"
"""The progress phase of a merge pass (``Progress``)."""


class ExtractorTrack:
    """Runs πϕ's side of the loop on a background thread (see the module docstring)."""

    def __init__(
        self,
        extractor: Extractor,
        store: ExperienceStore,
        buffer: CreditBuffer,
        *,
        scopes: Sequence[str],
        update: ExtractorUpdate | None = None,
        warmup_steps: int = 0,
        distil_batch: int = 16,
        cancel: CancelToken | None = None,
        journal: Path | None = None,
        progress: Progress | None = None,
        trains_here: bool = True,
    ) -> None:
        """``update=None``: πϕ stays frozen (static_online) but still keeps the bank online. ``cancel``:
        once set, queued work is dropped and the current item stops at its next batch or micro-batch (both
        stay in the checkpoint's unfinished items). ``journal``: the file of finished work (see
        ``TrackJournal``); the run's folder keeps it across attempts. ``progress``: where πϕ's work is
        (distilling a step's episodes, merging, a CISPO update), reported from the track's thread.
        ``trains_here`` False: the thread fills the credit buffer but leaves πϕ's updates to the loop
        (``take_ready``, ``train``): a sharded πϕ trains on every rank at once."""
        self.extractor = extractor
        self.store = store
        self.buffer = buffer
        self.scopes = list(scopes)
        self.update = update
        self.warmup_steps = warmup_steps
        self.trains_here = trains_here
        self.distil_batch = distil_batch
        self.progress = progress or Progress(None)
        self.cancel = cancel or CancelToken()
        if update is not None:
            update.cancel = self.cancel
        self.counts: Counter = Counter()
        self.last_update: Metrics = {}
        self.latest_step = 0
        self._merge_keys: set[str] = set()
        self._pending_credits: list[Credit] = []
        self.journal = TrackJournal(journal)
        self._in_flight: dict[str, dict] = {}
        """Per job (distil, merge), πϕ's counters when its piece of work under way began."""
        self._keys = (f"{uuid.uuid4().hex[:8]}:{n}" for n in itertools.count())
        self._unfinished: dict[str, _Episodes | _Merge] = {}
        self._episodes: deque[_Episodes] = deque()
        self._merges: deque[_Merge] = deque()
        self._outstanding = 0
        """Items queued or under way (``drain`` waits for none)."""
        self._closing = False
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self.update_lock = threading.Lock()
        """Held while πϕ's trainer state changes (credits, an update and its sync): hold it to read the
        weights, the optimiser and the credit buffer whole (a checkpoint)."""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="extractor-track", daemon=True)
        self._thread.start()

    # ---- the actor's side: never blocks --------------------------------------------------------------

    def submit(self, step: int, requests: Sequence[DistilRequest], credits: Sequence[Credit]) -> None:
        """Queue one actor step's episodes for distillation and their outcomes for credit."""
        self.check()
        with self._lock:
            self.latest_step = max(self.latest_step, step)
            self._pending_credits.extend(credits)
        self._enqueue(_Episodes(next(self._keys), step, tuple(requests)))

    def request_merge(self, step: int) -> None:
        self.check()
        with self._lock:
            if self._merges:  # one still waits to start: it reads the bank when it does
                self.counts.update(merges_coalesced=1)
                return
        self._enqueue(_Merge(next(self._keys), step))

    def _enqueue(self, item: _Episodes | _Merge) -> None:
        with self._wake:
            self._unfinished[item.key] = item
            (self._episodes if isinstance(item, _Episodes) else self._merges).append(item)
            self._outstanding += 1
            self._wake.notify()

    def check(self) -> None:
        """Raise the track's error, if it stopped on one."""
        if self._error is not None:
            raise TrackFailed(f"the extractor track stopped: {self._error}") from self._error

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued item is done (tests, the end of a run); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outstanding and self._error is None:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        self.check()
        return True

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued work and stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join(timeout)

    def metrics(self) -> Metrics:
        """A snapshot for the actor's step report."""
        self.check()
        with self._lock:
            out = {f"extractor/{k}": float(v) for k, v in self.counts.items()}
            out |= self.last_update
        out |= self.extractor.snapshot_stats()
        out["extractor/weight_version"] = float(self.extractor.expected_version)
        with self._lock:
            out["extractor/queue_depth"] = float(len(self._episodes) + len(self._merges))
        out["extractor/buffer"] = float(len(self.buffer.pending))
        out["extractor/steps"] = float(self.buffer.steps_taken)
        out["bank/size"] = float(self.store.size())
        return out

    def settle_credits(self) -> None:
        """Credit every outcome submitted so far, on the caller's thread; the caller holds ``update_lock``
        (a checkpoint, so that its buffer holds the outcomes of every step it covers)."""
        self._credit(self._take_credits())

    def state_dict(self) -> dict:
        """The credit state, the counters and the unfinished work, for a checkpoint (which keeps πϕ's
        weights and optimiser state: ``trainer.checkpoint.Checkpointer``); the caller holds ``update_lock``
        (and calls ``settle_credits`` first)."""
        with self._lock:  # the counters and the journal as of the same moment
            counts = dict(self.counts)
            stats = self._finished_stats()
            unfinished = list(self._unfinished.values())
            credits = list(self._pending_credits)
            journaled = sorted(k for k in self.journal.finished if _item_of(k) in self._unfinished)
        return {
            "buffer": self.buffer.state_dict(),
            "merge_keys": sorted(self._merge_keys),
            "counts": counts,
            "extractor_stats": stats,
            "unfinished": unfinished,
            "journaled": journaled,
            "pending_credits": credits,
        }

    def _finished_stats(self) -> dict:
        """πϕ's counters less what the work under way has counted so far (it is done again, or
        journaled, by a resumed run); the caller holds ``_lock``."""
        stats = self.extractor.stats_state()
        for job in self._in_flight:
            for name, delta in self._counted_since_begin(job).items():
                stats[name] = dict(Counter(stats[name]) - Counter(delta))
        return stats

    def _counted_since_begin(self, job: str) -> dict:
        """What πϕ counted for ``job`` since ``_begin(job)``; the caller holds ``_lock``."""
        before = self._in_flight[job]
        return {
            name: delta
            for name, now in job_counts(self.extractor.stats_state(), job).items()
            if (delta := {k: v - before.get(name, {}).get(k, 0) for k, v in now.items()})
        }

    def load_state_dict(self, state: dict) -> None:
        """The credit state; also the counters, so that a resumed run's cumulative figures go on from the
        checkpoint's, and the checkpoint's unfinished work, queued ahead of anything new (a checkpoint
        written before these were saved starts the counters at zero and has no work to give back)."""
        with self.update_lock:
            self.buffer.load_state_dict(state["buffer"])
            self._merge_keys = set(state["merge_keys"])
        with self._lock:
            self.counts = Counter(state.get("counts", {}))
            self._pending_credits = list(state.get("pending_credits", [])) + self._pending_credits
        self.extractor.load_stats_state(state.get("extractor_stats", {}))
        unfinished = state.get("unfinished", [])
        self._count_what_the_lost_attempt_finished(unfinished, state.get("journaled"))
        with self._lock:  # the steps they came from are past warm-up or not, as before the kill
            self.latest_step = max([self.latest_step, *(item.step for item in unfinished)])
        for item in unfinished:
            self._enqueue(item)

    def _count_what_the_lost_attempt_finished(self, unfinished: Sequence, journaled: Sequence | None) -> None:
        """Count the journaled work on the checkpoint's unfinished items that the checkpoint does not: the
        lost attempt finished it afterwards (a checkpoint that lists no journaled keys counts none)."""
        if journaled is None:
            return
        keys = {item.key for item in unfinished}
        before = set(journaled)
        for key, finished in self.journal.finished.items():
            if _item_of(key) in keys and key not in before:
                self._count(**finished.counts)
                self.extractor.add_stats(finished.stats)
                self._merge_keys.update(finished.merge_keys)

    # ---- the background thread -----------------------------------------------------------------------

    def _count(self, **deltas: float) -> None:
        with self._lock:
            self.counts.update(deltas)

    def _work(self) -> None:
        try:
            while (item := self._next()) is not None:
                try:
                    if self._error is None and not self.cancel.is_set():
                        self._catch_up()
                        self._do(item)
                        self._maybe_train()
                except Cancelled:
                    pass  # the run stops; unfinished items stay in the checkpoint (see TrackJournal)
                except BaseException as exc:  # noqa: BLE001 - re-raised on the actor's side by check()
                    self._error = exc
                finally:
                    self._settle()
        finally:
            self.store.close_thread()

    def _next(self, *, episodes_only: bool = False) -> _Episodes | _Merge | None:
        """The next item, episodes before merges; None when closing and nothing is left (or, with
        ``episodes_only``, when no episodes wait). Blocks only for the main loop."""
        with self._wake:
            while not episodes_only and not (self._episodes or self._merges or self._closing):
                self._wake.wait()
            if self._episodes:
                return self._episodes.popleft()
            if self._merges and not episodes_only:
                return self._merges.popleft()
            return None

    def _do(self, item: _Episodes | _Merge) -> None:
        if isinstance(item, _Episodes):
            self._distil(item)
        else:
            self._merge(item)
        with self._lock:
            del self._unfinished[item.key]
            if isinstance(item, _Episodes) and item.key not in self.journal.finished:
                self.journal.record(item.key)  # all its batches are: nothing of it is left to do

    def _begin(self, job: str) -> None:
        """A piece of ``job``'s work starts: what πϕ counts until ``_finish`` is not yet the checkpoint's."""
        with self._lock:
            self._in_flight[job] = job_counts(self.extractor.stats_state(), job)

    def _finish(self, key: str, job: str, counts: Metrics, merge_keys: Sequence[str] = ()) -> None:
        """Journal a finished piece of work with what it counted, and count it, at one moment for a
        checkpoint."""
        with self._lock:
            stats = self._counted_since_begin(job)
            del self._in_flight[job]
            self.journal.record(key, Finished(dict(counts), stats, tuple(merge_keys)))
            self.counts.update(counts)

    def _settle(self) -> None:
        """One item is over: done, dropped by a cancel, or stopped by an error."""
        with self._lock:
            self._outstanding -= 1

    def _distil_arrivals(self) -> None:
        """Between a merge pass's chunks: the episodes that arrived since it started."""
        while (item := self._next(episodes_only=True)) is not None:
            try:
                self._do(item)
            finally:
                self._settle()

    def _catch_up(self) -> None:
        """Credit what the actor has submitted so far, and train if that filled the buffer."""
        with self.update_lock:
            self._credit(self._take_credits())
        self._maybe_train()

    def _take_credits(self) -> list[Credit]:
        with self._lock:
            credits, self._pending_credits = self._pending_credits, []
        return credits

    def _credit(self, credits: Sequence[Credit]) -> None:
        """To the store's counters and the buffer; the caller holds ``update_lock`` (so that a checkpoint
        sees each credit either done or pending, never half done)."""
        if not credits:
            return
        t0 = time.perf_counter()
        outcomes = [GuidedOutcome(c.episode_id, c.success, c.entry_id) for c in credits]
        self.store.record_outcomes(outcomes)
        ids = sorted({c.entry_id for c in credits if c.entry_id is not None})
        seen = {c.entry_id: c.entry_version for c in credits if c.entry_id is not None and c.entry_version}
        behind = self.store.generations(ids, seen) if ids else {}
        keys = set()
        for c in credits:
            if c.generation is not None:
                keys.add(self.buffer.credit(c.generation, c.success, kind="refine"))
            if c.entry_id is not None:
                g = behind.get(c.entry_id)
                kind = "merge" if g is not None and generation_key(g) in self._merge_keys else "distil"
                keys.add(self.buffer.credit(g, c.success, kind=kind, entry_id=c.entry_id))
        keys.discard(None)
        # distinct generations an actor step credits: what fills the buffer of unique generations
        self._count(credited=len(credits), credited_generations=len(keys), credit_s=time.perf_counter() - t0)

    def _distil(self, item: _Episodes) -> None:
        requests = item.requests
        self.progress.start(item.step, "extractor: distilling", "episodes", len(requests))
        for i in range(0, len(requests), self.distil_batch):
            batch_key = f"{item.key}/{i}"
            self.progress.advance(i)
            if batch_key in self.journal.finished:
                continue  # finished by the attempt that checkpointed this item
            self.cancel.check()
            if i:
                self._catch_up()
            self._begin("distil")
            t0 = time.perf_counter()
            results = self.extractor.distil(requests[i : i + self.distil_batch])
            t1 = time.perf_counter()
            ops = [op for r in results for op in r.ops]
            applied = self.store.apply(ops, step=item.step, key=batch_key) if ops else []
            counts = {
                "distilled": len(results),
                "ops_applied": sum(r.ok and r.entry_id is not None for r in applied),
                "ops_refused": sum(not r.ok for r in applied),
                "distil_s": t1 - t0,
                "apply_s": time.perf_counter() - t1,
            }
            self._finish(batch_key, "distil", counts)
        self.progress.advance(len(requests))

    def _merge(self, item: _Merge) -> None:
        """A merge the lost attempt left half done is done again whole: a pass over a merged bank."""
        if item.key in self.journal.finished:
            return
        self._begin("merge")
        self.progress.start(item.step, MERGING, "chunks")
        t0 = time.perf_counter()
        merge_fn = self.extractor.merge_fn
        counts: Counter = Counter()
        merge_keys: list[str] = []
        chunks_done = 0

        def remember(chunk):  # merged entries' generations are credited as merges
            nonlocal chunks_done
            self._catch_up()
            self._distil_arrivals()
            if self.progress.phase != MERGING:  # the pass again, after distilling arrivals between chunks
                self.progress.start(item.step, MERGING, "chunks", done=chunks_done)
            self.progress.advance(chunks_done)
            self.cancel.check()
            plan = merge_fn(chunk)
            chunks_done += 1
            if plan.generation is not None:
                merge_keys.append(generation_key(plan.generation))
                self._merge_keys.add(merge_keys[-1])
            return plan

        for scope in self.scopes:
            report = self.store.merge(scope, remember, step=item.step)
            counts.update(
                merges=1,
                merge_chunks=report.chunks,
                merge_removed=report.removed,
                merge_created=report.created,
                merge_rewritten=report.rewritten,
                merge_unparseable=report.unparseable,
                merge_stale=report.stale,
            )
        counts.update(merge_s=time.perf_counter() - t0)
        self._finish(item.key, "merge", counts, merge_keys)

    def _maybe_train(self) -> None:
        if not self.trains_here:
            return
        while self._trainable() and self.buffer.ready():
            with self.update_lock:
                self.train(self.buffer.take())

    def _trainable(self) -> bool:
        return self.update is not None and self.latest_step > self.warmup_steps

    def take_ready(self) -> list[Batch]:
        """Every full buffer, with the outcomes submitted so far credited first: for a loop that trains πϕ
        itself (``trains_here`` False: its sharded update is a collective of every rank). The caller holds
        ``update_lock`` until it has trained them (``train``), so that no checkpoint sees them taken but
        not trained."""
        self._credit(self._take_credits())
        batches = []
        while self._trainable() and self.buffer.ready():
            batches.append(self.buffer.take())
        return batches

    def train(self, batch: Batch) -> None:
        """One CISPO update of πϕ on ``batch`` and its sync, counted; the caller holds ``update_lock``."""
        t0 = time.perf_counter()
        self.progress.start(self.latest_step, "extractor: CISPO update")
        metrics = self.update.train(batch, self.extractor)
        release_freed_memory()
        self.store.record_training(batch.entry_ids, step=batch.step)
        with self._lock:
            self.last_update = metrics
        self._count(
            updates=1,
            updates_with_signal=float(metrics["extractor/adv_abs_mean"] > 0),
            update_s=time.perf_counter() - t0,
            adv_abs_sum=metrics["extractor/adv_abs_mean"],
            clip_frac_sum=metrics["extractor/clip_frac"],
        )

"""ExperienceManager: one per run, shared by all rollout workers (``trainer.store.ExperienceStore``).

Reads: callers' queries go to a micro-batcher thread that waits for ``batch_size`` queries or
``max_wait_s`` (16, 1 ms), embeds the cache misses in one forward pass, folds identical queries into one
search, and spreads the searches over ``workers`` threads (4), each with its own database connection. A
search takes the read side of a writer-priority reader–writer lock and fetches ``oversample`` × k
candidates by cosine distance through the HNSW index; a worker sends its slice of a batch in one pipelined
round trip. The batch thread then re-ranks the batch's candidates in the order the queries came
(``experience.retrieval``; each counted pick demotes its entry for every later query) and counts the
retrievals with in-place increments in one more round trip, outside the writer lock, before it takes the
next batch. So a list of queries gets what retrieving them one after another would give, whichever thread
fetched what: a run replays exactly (it did not while each worker re-ranked and counted its own slice).

Writes (operations, merges, undo, import, people's edits through ``write_access``) take the writer side
and go through ``experience.bank``, which makes each one atomic and records it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from pgvector import Vector

from experience import bank, retrieval, transfer
from experience.embedding import Embedder, default_embedder
from experience.locks import RWLock
from experience.models import AppliedBatch, Experience, ExperienceChange, SearchAsk
from trainer.store import (
    Add,
    Delete,
    Entry,
    Generation,
    GuidedOutcome,
    MergeFn,
    MergeReport,
    Op,
    OpResult,
    Refinement,
    Return,
    Update,
)

log = logging.getLogger(__name__)
Kind = ExperienceChange.Kind

_SEARCH_SQL = f"""
SELECT id, scope, title, content, version, pinned, retrieval_count, last_retrieved_at, training_count,
       last_trained_step, guided_successes, guided_failures, created_step, updated_step,
       1 - (embedding <=> %(q)s::vector) AS similarity
FROM {Experience._meta.db_table}
WHERE run_id = %(run)s AND scope = %(scope)s AND deleted_at IS NULL
ORDER BY (embedding <=> %(q)s::vector){{exact}}
LIMIT %(n)s
"""
# "+ 0" hides the ORDER BY from the HNSW index: an exact scan, used when the index's filtered result is short.
SEARCH_HNSW = _SEARCH_SQL.format(exact="")
SEARCH_EXACT = _SEARCH_SQL.format(exact=" + 0")
_COUNT_SQL = (
    f"UPDATE {Experience._meta.db_table} SET retrieval_count = retrieval_count + %s, last_retrieved_at = %s "
    "WHERE id = %s"
)


@dataclass
class _Request:
    text: str
    scope: str
    k: int
    future: Future
    count: bool = True


@dataclass
class RetrievalStats:
    queries: int = 0
    batches: int = 0
    searches: int = 0
    """SQL searches run (identical queries in one batch share one)."""
    exact_fallbacks: int = 0

    @property
    def mean_batch(self) -> float:
        return self.queries / self.batches if self.batches else 0.0


_live: dict[int, ExperienceManager] = {}
_live_lock = threading.Lock()


def live_manager(run_id: int | None) -> ExperienceManager | None:
    """The manager serving this run in this process, if any."""
    with _live_lock:
        return _live.get(run_id) if run_id is not None else None


@contextmanager
def write_access(run_id: int | None) -> Iterator[ExperienceManager | None]:
    """The writer side of the run's live manager (if one runs here) around a write from outside it.

    Writers in other processes are serialised by ``bank.lock_bank``'s advisory lock in any case.
    """
    manager = live_manager(run_id)
    if manager is None:
        yield None
        return
    with manager.rw.write():
        yield manager


class ExperienceManager:
    """The experience bank of one run (see the module docstring). Use as a context manager, or ``close()``.

    ``ef_search`` is pgvector's HNSW search breadth: 200 keeps recall@1 ≥ 0.95 against an exact scan at
    100k entries (``manage.py bench_retrieval``); smaller banks are exact or nearly so at any value ≥ 40.
    ``capacity`` bounds the live entries of the run (FIFO eviction of unpinned ones); ``merge_chunk`` is N.
    """

    def __init__(
        self,
        run_id: int,
        *,
        embedder: Embedder | None = None,
        batch_size: int = 16,
        max_wait_s: float = 0.001,
        workers: int = 4,
        oversample: int = retrieval.OVERSAMPLE,
        lam: float = retrieval.LAMBDA,
        recency_window_s: float = retrieval.RECENCY_WINDOW_S,
        diversify: bool = True,
        relevance: str = "rank",
        ef_search: int = 200,
        capacity: int = 20_000,
        merge_chunk: int = 5,
    ):
        if batch_size < 1 or workers < 1 or merge_chunk < 2:
            raise ValueError("batch_size and workers must be ≥ 1, merge_chunk ≥ 2")
        self.run_id = run_id
        self.embedder = embedder or default_embedder()
        self.batch_size, self.max_wait_s, self.n_workers = batch_size, max_wait_s, workers
        self.oversample, self.lam, self.recency_window_s = oversample, lam, recency_window_s
        self.diversify, self.relevance, self.ef_search = diversify, relevance, ef_search
        self.capacity, self.merge_chunk = capacity, merge_chunk
        self.rw = RWLock()
        self.stats = RetrievalStats()
        self._stats_lock = threading.Lock()
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._session = threading.local()
        self._closed = False
        with _live_lock:
            if run_id in _live:
                raise RuntimeError(f"run {run_id} already has a live ExperienceManager in this process")
            _live[run_id] = self
        self._threads = [threading.Thread(target=self._batch_loop, name=f"exp-batch-{run_id}", daemon=True)]
        self._threads += [
            threading.Thread(target=self._search_loop, name=f"exp-search-{run_id}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def __enter__(self) -> ExperienceManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Finish queued searches, stop the threads (closing their connections), leave the registry."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        self._threads[0].join()
        for _ in range(self.n_workers):
            self._work.put(None)
        for t in self._threads[1:]:
            t.join()
        with _live_lock:
            _live.pop(self.run_id, None)

    def close_thread(self) -> None:
        connection.close()  # Django's connections are per thread: a thread that ends closes its own

    # ---- retrieval -----------------------------------------------------------------------------------

    def submit(self, query: str, scope: str, k: int = 1, *, count: bool = True) -> Future:
        """Queue one query; the future resolves to its top-k entries (a list, best first). ``count``:
        record the retrieval in the entries' usage counters (which the diversified re-rank reads)."""
        if self._closed:
            raise RuntimeError("this ExperienceManager is closed")
        request = _Request(query, scope, k, Future(), count)
        self._requests.put(request)
        return request.future

    def retrieve(
        self, queries: Sequence[str], scope: str, k: int = 1, *, count: bool = True
    ) -> list[list[Entry]]:
        futures = [self.submit(q, scope, k, count=count) for q in queries]
        return [f.result() for f in futures]

    def _batch_loop(self) -> None:
        stop = False
        while not stop:
            first = self._requests.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + self.max_wait_s
            while len(batch) < self.batch_size:
                try:
                    item = self._requests.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._dispatch(batch)
        connection.close()

    def _dispatch(self, batch: list[_Request]) -> None:
        """Embed, fetch and rank one batch, and answer its callers, before the next batch starts: each
        batch sees the usage counts of every one before it."""
        groups: dict[tuple[str, str, int, bool], list[_Request]] = defaultdict(list)
        for r in batch:
            groups[(r.text, r.scope, r.k, r.count)].append(r)
        texts = [r.text for r in batch]  # duplicates count as cache hits; each distinct miss is encoded once
        try:
            vectors = dict(zip(texts, self.embedder.embed(texts), strict=True))
            queries = [
                (vectors[text], scope, k, len(requests), counted)
                for (text, scope, k, counted), requests in groups.items()
            ]
            with self._stats_lock:
                self.stats.queries += len(batch)
                self.stats.batches += 1
                self.stats.searches += len(groups)
            results = self._rank(queries, self._fetch_in_parallel(queries))
        except Exception as exc:  # noqa: BLE001 - handed to every waiting caller
            connection.close_if_unusable_or_obsolete()  # a dropped connection reopens on the next search
            for r in batch:
                r.future.set_exception(exc)
            return
        for requests, answers in zip(groups.values(), results, strict=True):
            for r, entries in zip(requests, answers, strict=True):
                r.future.set_result(entries)

    def _fetch_in_parallel(self, queries: list[tuple]) -> list[list[tuple]]:
        """Each query's candidate rows, the searches spread over the worker threads (one slice each)."""
        if len(queries) == 1:  # nothing to parallelise: search here and save a thread hand-off
            return self.fetch(queries)
        slices = [list(range(len(queries)))[i :: self.n_workers] for i in range(self.n_workers)]
        futures = []
        for idx in (s for s in slices if s):
            futures.append((idx, Future()))
            self._work.put(([queries[i] for i in idx], futures[-1][1]))
        rows: list[list[tuple]] = [[] for _ in queries]
        for idx, future in futures:
            for i, found in zip(idx, future.result(), strict=True):
                rows[i] = found
        return rows

    def _search_loop(self) -> None:
        try:
            while (work := self._work.get()) is not None:
                queries, future = work
                try:
                    future.set_result(self.fetch(queries))
                except Exception as exc:  # noqa: BLE001 - handed to the batch thread
                    connection.close_if_unusable_or_obsolete()
                    future.set_exception(exc)
        finally:
            connection.close()

    def _ensure_session(self) -> None:
        """Per-connection settings, set again whenever Django has opened a new connection."""
        connection.ensure_connection()
        if getattr(self._session, "raw", None) is not connection.connection:
            with connection.cursor() as cursor:
                cursor.execute(f"SET hnsw.ef_search = {int(self.ef_search)}")
                # Usage counters are statistics: a crash may lose the last few ms of them, but no retrieval
                # has to wait for a WAL flush. (Only this search connection; operations stay durable.)
                cursor.execute("SET synchronous_commit = off")
            self._session.raw = connection.connection

    def search_vectors(self, queries: Sequence[tuple]) -> list[list[list[Entry]]]:
        """One search per embedded query ``(vector, scope, k, n, counted)`` asked by ``n`` identical
        requests: the top-k diversified entries of each request, in order (``_rank``)."""
        return self._rank(queries, self.fetch(queries))

    def fetch(self, queries: Sequence[tuple]) -> list[list[tuple]]:
        """The candidate rows of each query ``(vector, scope, k, ...)``: ``oversample`` × k by cosine
        distance, through the HNSW index (an exact scan where its filtered result ran short). All
        searches go in one round trip, under the read side of the lock."""
        factor = self.oversample if self.diversify else 1
        params = [
            {"q": Vector._to_db(vector), "run": self.run_id, "scope": scope, "n": k * factor}
            for vector, scope, k, *_ in queries
        ]
        with self.rw.read():
            self._ensure_session()
            raw = connection.connection
            cursors = [raw.cursor() for _ in params]
            try:
                with raw.pipeline():
                    for cursor, p in zip(cursors, params, strict=True):
                        cursor.execute(SEARCH_HNSW, p)
                    rows = [cursor.fetchall() for cursor in cursors]
            finally:
                for cursor in cursors:
                    cursor.close()
            for i, p in enumerate(params):
                if (
                    len(rows[i]) < p["n"]
                ):  # the filtered HNSW result ran short (small or mixed bank): scan exactly
                    with raw.cursor() as cursor:
                        cursor.execute(SEARCH_EXACT, p)
                        rows[i] = cursor.fetchall()
                    with self._stats_lock:
                        self.stats.exact_fallbacks += 1
        return rows

    def _rank(self, queries: Sequence[tuple], rows: Sequence[list[tuple]]) -> list[list[list[Entry]]]:
        """Re-rank each query's candidates in the queries' order, and count the retrievals.

        Counted requests are served in turn, as if each came after the one before it: a pick demotes that
        entry for every later request (``retrieval.rerank_in_turn``, whatever the later request's text),
        so a batch answers the same whichever threads fetched it, and a run replays exactly. Identical
        requests, folded into one query, are served one after another at the first one's place. Read-only
        requests all get the ranking as it stands."""
        now = timezone.now()
        results, counts = [], defaultdict(int)
        ranking = {
            "diversify": self.diversify,
            "lam": self.lam,
            "window_s": self.recency_window_s,
            "relevance": self.relevance,
        }
        for (_, _, k, n, counted), found in zip(queries, rows, strict=True):
            candidates = [_candidate(r, counts.get(r[0], 0), now) for r in found]
            if counted:
                picks = retrieval.rerank_in_turn(candidates, k, n, now, **ranking)
                for c in (c for chosen in picks for c in chosen):
                    counts[c.id] += 1
            else:
                picks = [retrieval.rerank(candidates, k, now, **ranking)] * n
            by_id = {r[0]: r for r in found}
            results.append([[_row_entry(by_id[c.id], c.score) for c in chosen] for chosen in picks])
        self._count_retrievals(counts, now)
        return results

    def _count_retrievals(self, counts: dict[int, int], now) -> None:
        """F()-style increments (``SET n = n + c``), never under the writer lock, in one round trip.

        Rows are always locked in ascending id order (here and in a merge's ``select_for_update``), so
        counter updates and merges can never deadlock."""
        if not counts:
            return
        self._ensure_session()
        with connection.connection.cursor() as cursor:  # executemany pipelines its statements
            cursor.executemany(_COUNT_SQL, [(counts[i], now, i) for i in sorted(counts)])

    # ---- operations ----------------------------------------------------------------------------------

    def apply(self, ops: Sequence[Op], *, step: int, key: str = "") -> list[OpResult]:
        """Apply extractor operations in order; each is atomic and recorded. Pinned entries refuse them.

        With ``key`` the batch applies once: all its operations and a record of the key commit together,
        and a key already recorded applies nothing and returns the recorded outcomes (a resumed process
        doing again a batch that the lost one had committed)."""
        texts = [bank.entry_text(op.title, op.content) for op in ops if isinstance(op, Add | Update)]
        vectors = dict(zip(texts, self.embedder.embed(texts), strict=True))
        if not key:
            results = []
            for op in ops:
                with self.rw.write():
                    results.append(self._apply_or_refuse(op, vectors, step))
            return results
        with self.rw.write(), transaction.atomic():
            done = AppliedBatch.objects.select_for_update().filter(run_id=self.run_id, key=key).first()
            if done is not None:  # the same operations again: pair them with what they did then
                recorded = zip(ops, done.results, strict=False)
                return [OpResult(op, r["entry_id"], r["error"]) for op, r in recorded]
            results = [self._apply_or_refuse(op, vectors, step) for op in ops]
            outcomes = [{"entry_id": r.entry_id, "error": r.error} for r in results]
            AppliedBatch.objects.create(run_id=self.run_id, key=key, results=outcomes)
        return results

    def _apply_or_refuse(self, op: Op, vectors: dict, step: int) -> OpResult:
        if isinstance(op, Return):
            return OpResult(op)
        try:
            with transaction.atomic():  # a refused operation leaves the batch's others standing
                return OpResult(op, self._apply_one(op, vectors, step))
        except bank.BankError as exc:
            return OpResult(op, error=str(exc))

    def _apply_one(self, op: Op, vectors: dict, step: int) -> int:
        model = self.embedder.model_id
        if isinstance(op, Add):
            vector = vectors[bank.entry_text(op.title, op.content)]
            e = bank.add(
                self.run_id, op.scope, op.title, op.content, vector, embedding_model=model, step=step,
                generation=op.generation, source_episode=op.source_episode, capacity=self.capacity,
            )  # fmt: skip
            return e.pk
        if self._is_pinned(op.entry_id):
            raise bank.BankError(f"experience #{op.entry_id} is pinned: only a person can change it")
        if isinstance(op, Update):
            vector = vectors[bank.entry_text(op.title, op.content)]
            e = bank.update(
                op.entry_id, op.title, op.content, vector, run_id=self.run_id, embedding_model=model,
                step=step, generation=op.generation, source_episode=op.source_episode or None,
            )  # fmt: skip
            return e.pk
        if isinstance(op, Delete):
            return bank.delete(op.entry_id, run_id=self.run_id, step=step).pk
        raise TypeError(f"not an experience operation: {op!r}")

    @staticmethod
    def _is_pinned(entry_id: int) -> bool:
        return Experience.objects.filter(pk=entry_id, pinned=True).exists()

    # ---- merge ---------------------------------------------------------------------------------------

    def merge(self, scope: str, merge_fn: MergeFn, *, step: int) -> MergeReport:
        """One pass over the scope's bank in chunks of ``merge_chunk`` entries, oldest first.

        A chunk's merged or rewritten entries are carried into the next chunk, on top of its own
        ``merge_chunk`` entries (up to chunk − 1 of them, so a call sees at most 2·chunk − 1 entries): the
        window slides over the whole bank with bounded context, and a pass is ⌈size / chunk⌉ calls
        whatever πϕ answers, as in the authors' code (``_merge_single_task`` splits the entries first,
        then appends each chunk's outputs to the next). ``merge_fn`` runs without any lock (it is an LLM
        call); its plan is applied under the writer lock, atomically, only if no entry of the chunk
        changed meanwhile.
        """
        ids = list(Experience.objects.in_bank(self.run_id, scope).order_by("id").values_list("id", flat=True))
        report = MergeReport(scope=scope)
        carried: list[int] = []
        chunk_index = 0
        for pos in range(0, len(ids), self.merge_chunk):
            chunk = self.entries(carried + ids[pos : pos + self.merge_chunk])
            if not chunk:
                continue
            plan = merge_fn(chunk)
            texts = {(a.title, a.content) for a in plan.actions or () if a.kind in ("rewrite", "merge")}
            embedded = self.embedder.embed([bank.entry_text(*t) for t in texts])
            vectors = dict(zip(texts, embedded, strict=True))
            with self.rw.write():
                record, carried = bank.apply_merge_plan(
                    self.run_id, scope, chunk, plan, vectors, embedding_model=self.embedder.model_id,
                    step=step, chunk_index=chunk_index, carry_max=self.merge_chunk - 1,
                )  # fmt: skip
            chunk_index += 1
            kinds = [c.kind for c in record.changes.all()]
            report.chunks += 1
            report.merge_ids.append(record.pk)
            report.removed += kinds.count(Kind.MERGE_REMOVE)
            report.created += kinds.count(Kind.MERGE_ADD)
            report.rewritten += kinds.count(Kind.MERGE_REWRITE)
            report.unparseable += record.decision == record.Decision.UNPARSEABLE
            report.stale += record.decision == record.Decision.STALE
        return report

    # ---- Search-and-Ask, outcomes, training counters -------------------------------------------------

    def record_ask(
        self,
        query: str,
        scope: str,
        entry: Entry | None,
        refinement: Refinement,
        *,
        episode_id: str = "",
        step: int = 0,
    ) -> int:
        g = refinement.generation or Generation()
        exchange = SearchAsk.objects.create(
            run_id=self.run_id, scope=scope, query=query, experience_id=entry.id if entry else None,
            similarity=entry.similarity if entry else None, refined=refinement.text, episode_id=episode_id,
            step=step, generation_prompt=g.prompt, generation_response=g.response,
            generation_token_ids=list(g.token_ids), generation_logprobs=list(g.logprobs),
            generation_weight_version=g.weight_version,
        )  # fmt: skip
        return exchange.pk

    def record_outcomes(self, outcomes: Sequence[GuidedOutcome]) -> None:
        tally: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for o in outcomes:
            if o.entry_id is not None:
                tally[o.entry_id][0 if o.success else 1] += 1
        for entry_id in sorted(tally):
            wins, losses = tally[entry_id]
            Experience.objects.filter(pk=entry_id).update(
                guided_successes=F("guided_successes") + wins, guided_failures=F("guided_failures") + losses
            )
        for o in outcomes:
            if o.episode_id:
                SearchAsk.objects.filter(run_id=self.run_id, episode_id=o.episode_id).update(
                    success=o.success
                )

    def record_training(self, entry_ids: Sequence[int], *, step: int) -> None:
        for entry_id in sorted(set(entry_ids)):
            Experience.objects.filter(pk=entry_id).update(
                training_count=F("training_count") + 1, last_trained_step=step
            )

    # ---- reads for the trainer and the dashboard -----------------------------------------------------

    def entries(self, ids: Sequence[int]) -> list[Entry]:
        """Live entries by id, in the order given (deleted or unknown ids are left out)."""
        rows = {
            e.pk: e for e in Experience.objects.in_bank(self.run_id).filter(pk__in=ids).defer("embedding")
        }
        return [bank.to_entry(rows[i]) for i in ids if i in rows]

    def generations(
        self, entry_ids: Sequence[int], versions: Mapping[int, int] | None = None
    ) -> dict[int, Generation]:
        versions = versions or {}
        rows = Experience.objects.filter(run_id=self.run_id, pk__in=entry_ids).only(
            "version", *bank.GENERATION_FIELDS
        )
        out = {}
        for e in rows:
            seen = versions.get(e.pk, e.version)
            g = bank.generation_of(e) if seen == e.version else bank.generation_at(e.pk, seen)
            if g is not None:
                out[e.pk] = g
        return out

    def size(self, scope: str | None = None) -> int:
        return Experience.objects.in_bank(self.run_id, scope).count()

    # ---- undo, export, import ------------------------------------------------------------------------

    def undo(self, change_id: int, *, user=None) -> ExperienceChange:
        with self.rw.write():
            return bank.undo_change(change_id, self.embedder, user=user)

    def undo_merge(self, merge_id: int, *, user=None) -> list[ExperienceChange]:
        with self.rw.write():
            return bank.undo_merge(merge_id, self.embedder, user=user)

    def export_jsonl(self, out: IO[str], *, scope: str | None = None) -> int:
        return transfer.export_jsonl(self.run_id, out, scope=scope)

    def import_jsonl(self, source: IO, *, user=None) -> int:
        return transfer.import_jsonl(
            self.run_id, source, self.embedder, user=user, capacity=self.capacity, writing=self.rw.write
        )


def _candidate(r: tuple, picked: int, now) -> retrieval.Candidate:
    """A candidate row as the re-rank sees it, with the ``picked`` retrievals made ``now`` earlier in the
    same batch (not yet in the row's counters)."""
    return retrieval.Candidate(r[0], r[14], r[6] + picked, now if picked else r[7])


def _row_entry(r: tuple, score: float | None) -> Entry:
    return Entry(
        id=r[0], scope=r[1], title=r[2], content=r[3], version=r[4], pinned=r[5], retrieval_count=r[6],
        training_count=r[8], last_trained_step=r[9], guided_successes=r[10], guided_failures=r[11],
        created_step=r[12], updated_step=r[13], similarity=r[14], score=score,
    )  # fmt: skip

"""Retrieval benchmark: fills banks of 10k and 100k entries in a database of its own and prints

- p50/p99 latency of one retrieval through the ExperienceManager (embedding cached, and not);
- throughput with micro-batching versus one query at a time (the same kind of fresh queries);
- HNSW recall@1 against an exact scan for several ``hnsw.ef_search`` values;
- the embedding cache hit rate on a group-rollout query stream (K/2 guided rollouts share a query).

Entries are synthetic but shaped like real ones: a few thousand generated experience texts are embedded
with the real model, and each entry's vector mixes one of them with a second one and noise. Rows go in
with binary COPY, and the HNSW index is built after loading. The database is dropped at the end.
"""

from __future__ import annotations

import random
import re
import threading
import time
import uuid

import numpy as np
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import connection
from django.utils import timezone
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

from experience.embedding import Embedder
from experience.manager import SEARCH_HNSW, ExperienceManager
from experience.models import Experience
from trainer.paths import cache_dir
from webapp.models import Run

SCOPE = "shared"
HNSW = next(index for index in Experience._meta.indexes if index.name == "experience_embedding_hnsw")
COPY_COLUMNS = """
    run_id:int8 scope:varchar title:varchar content:text embedding:vector embedding_model:varchar version:int4
    source_episode:varchar created_step:int4 updated_step:int4 retrieval_count:int4 training_count:int4
    guided_successes:int4 guided_failures:int4 pinned:bool generation_prompt:text generation_response:text
    generation_token_ids:jsonb generation_logprobs:jsonb created_at:timestamptz updated_at:timestamptz
"""
COLORS = ["red", "blue", "black", "white", "green", "grey", "navy", "beige"]
PRODUCTS = [
    "running shoes",
    "rain jacket",
    "wool socks",
    "leather wallet",
    "face cream",
    "desk lamp",
    "hoodie",
]
OBJECTS = ["mug", "apple", "plate", "knife", "book", "pen", "tomato", "cloth", "vase", "keychain", "potato"]
RECEPS = ["countertop", "cabinet", "drawer", "fridge", "microwave", "sinkbasin", "shelf", "desk", "sidetable"]
VERBS = ["heat", "cool", "clean", "put", "examine", "find two"]
ROOMS = ["5x5", "15x15", "dark 15x15", "monster 15x15", "trap 15x15", "maze 9x9", "key room"]


def _goal(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return f"{rng.choice(VERBS)} some {rng.choice(OBJECTS)} and put it in {rng.choice(RECEPS)}"
    if kind == 1:
        return (
            f"i need {rng.choice(COLORS)} {rng.choice(PRODUCTS)}, size {rng.choice('SMLX')}, "
            f"price lower than {rng.randrange(20, 200)} dollars"
        )
    return f"reach the staircase down in the {rng.choice(ROOMS)} room"


def _observation(rng: random.Random) -> str:
    return (
        f"You are in the middle of a room. Looking around you see a {rng.choice(RECEPS)} "
        f"{rng.randrange(1, 6)}, a {rng.choice(RECEPS)} {rng.randrange(1, 6)} and a {rng.choice(OBJECTS)}."
    )


def _experience_text(rng: random.Random) -> tuple[str, str]:
    obj, recep, verb = rng.choice(OBJECTS), rng.choice(RECEPS), rng.choice(VERBS)
    title = f"{verb.capitalize()} the {obj} before the {recep}"
    content = (
        f"Context: tasks that {verb} a {obj}. Actions: go to the {rng.choice(RECEPS)}, take the {obj}, "
        f"{verb} it, go to the {recep}, put it there. Rule: if the {recep} is closed, open it first; "
        f"if the {obj} is not visible, check {rng.choice(RECEPS)} then {rng.choice(RECEPS)}. "
        f"Avoid: repeating 'look' more than twice; buying {rng.choice(COLORS)} {rng.choice(PRODUCTS)} unseen."
    )
    return title, content


def query(goal: str, observation: str) -> str:
    return f"goal: {goal}, observation: {observation}"


def _pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.array(values), p))


class Command(BaseCommand):
    help = "Benchmark ExperienceManager retrieval on 10k/100k-entry banks (in a temporary database)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
        parser.add_argument("--texts", type=int, default=1000, help="Distinct embedded experience texts.")
        parser.add_argument("--latency-queries", type=int, default=300)
        parser.add_argument("--throughput-queries", type=int, default=256)
        parser.add_argument("--recall-queries", type=int, default=300)
        parser.add_argument("--ef-search", type=int, nargs="+", default=[40, 64, 100, 200])
        parser.add_argument("--ef-search-manager", type=int, default=None, help="Default: the manager's.")
        parser.add_argument("--m", type=int, default=HNSW.m)
        parser.add_argument("--ef-construction", type=int, default=HNSW.ef_construction)
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, **opts) -> None:
        db = settings.DATABASES["default"]
        db.setdefault("TEST", {})["NAME"] = f"bench_retrieval_{uuid.uuid4().hex[:8]}"
        old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        self.ef_search = opts["ef_search_manager"]
        try:
            self._bench(opts)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    def _manager(self, run_id: int, embedder: Embedder, **kwargs) -> ExperienceManager:
        if self.ef_search is not None:
            kwargs["ef_search"] = self.ef_search
        return ExperienceManager(run_id, embedder=embedder, **kwargs)

    def _say(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def _bench(self, opts: dict) -> None:
        rng = random.Random(opts["seed"])
        np_rng = np.random.default_rng(opts["seed"])
        t0 = time.perf_counter()
        embedder = Embedder()
        texts = [_experience_text(rng) for _ in range(opts["texts"])]
        cached = cache_dir("bench_retrieval") / f"{embedder.model_id}-{opts['seed']}-{len(texts)}.npy"
        if cached.exists():
            base = np.load(cached)
        else:
            base = embedder.embed([f"{t}\n{c}" for t, c in texts])
            np.save(cached, base)
        self._say(
            f"embedder {embedder.model_id}: {len(texts)} experience texts embedded "
            f"(or read from {cached.parent}) in {time.perf_counter() - t0:.1f} s"
        )
        owner = get_user_model().objects.create_user(f"bench-{uuid.uuid4().hex[:6]}")
        for size in opts["sizes"]:
            run = Run.objects.create(name=f"bench {size}", owner=owner)
            vectors = self._fill(run.pk, size, texts, base, np_rng, opts["m"], opts["ef_construction"])
            self._say(f"\n== bank of {size:,} entries ==")
            self._latency(run.pk, embedder, rng, opts["latency_queries"])
            self._throughput(run.pk, embedder, rng, opts["throughput_queries"])
            self._recall(run.pk, embedder, vectors, rng, opts["recall_queries"], opts["ef_search"])
            self._cache_stream(run.pk, embedder, rng)
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {Experience._meta.db_table} CASCADE")

    # ---- filling ---------------------------------------------------------------------------------

    def _fill(self, run_id: int, size: int, texts, base: np.ndarray, np_rng, m: int, ef_c: int) -> np.ndarray:
        """Synthetic entries: a text's vector + 0.35 × another's + noise, renormalised; COPY, then index."""
        t0 = time.perf_counter()
        first = np_rng.integers(0, len(texts), size)
        second = np_rng.integers(0, len(texts), size)
        noise = np_rng.standard_normal((size, base.shape[1])).astype(np.float32) * (
            0.25 / np.sqrt(base.shape[1])
        )
        vectors = base[first] + 0.35 * base[second] + noise
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        table = Experience._meta.db_table
        now = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS experience_embedding_hnsw")
        raw = connection.connection
        register_vector(raw)
        columns, types = zip(*(c.split(":") for c in COPY_COLUMNS.split()), strict=True)
        empty = Jsonb([])
        with raw.cursor() as cur:
            with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(list(types))
                for i in range(size):
                    title, content = texts[first[i]]
                    copy.write_row(
                        [run_id, SCOPE, title, content, vectors[i], "all-MiniLM-L6-v2", 1, f"ep-{i}",
                         i // 500, i // 500, 0, 0, 0, 0, False, "", "", empty, empty, now, now]
                    )  # fmt: skip
        loaded = time.perf_counter() - t0
        t1 = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("SET maintenance_work_mem = '1GB'")
            cursor.execute(
                f"CREATE INDEX experience_embedding_hnsw ON {table} "
                f"USING hnsw (embedding vector_cosine_ops) WITH (m = {m}, ef_construction = {ef_c})"
            )
            cursor.execute(f"ANALYZE {table}")
        self._say(
            f"filled {size:,} rows with COPY in {loaded:.1f} s; "
            f"HNSW index (m={m}, ef_construction={ef_c}) built in {time.perf_counter() - t1:.1f} s"
        )
        return vectors

    # ---- measurements --------------------------------------------------------------------------------

    def _latency(self, run_id: int, embedder: Embedder, rng: random.Random, n: int) -> None:
        tasks = [query(_goal(rng), _observation(rng)) for _ in range(n)]
        with self._manager(run_id, embedder) as manager:
            manager.retrieve(tasks[:10], SCOPE)  # warm connections
            cold, warm = [], []
            for text in tasks:
                t = time.perf_counter()
                manager.retrieve([text], SCOPE)  # a fresh query: embedded, then searched
                cold.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                manager.retrieve([text], SCOPE)  # the same query again: embedding cached
                warm.append((time.perf_counter() - t) * 1000)
            with connection.cursor() as cursor:
                cursor.execute(
                    "EXPLAIN " + SEARCH_HNSW, {"q": str(list(map(float, embedder.embed_one(tasks[0])))),
                                               "run": run_id, "scope": SCOPE, "n": 16}
                )  # fmt: skip
                lines = [re.sub(r"'\[.*?\]'", "'[...]'", row[0].strip()) for row in cursor.fetchall()]
                plan = " / ".join(lines[:3])
        self._say(f"plan: {plan}")
        for name, values in (("embedding cached", warm), ("embedding computed", cold)):
            self._say(
                f"latency of one retrieval ({name}): p50 {_pct(values, 50):.2f} ms, "
                f"p99 {_pct(values, 99):.2f} ms (n={len(values)})"
            )

    def _throughput(self, run_id: int, embedder: Embedder, rng: random.Random, n: int) -> None:
        """Fresh (never embedded) queries: one at a time (B=1, W=1) versus all submitted at once.
        The two modes alternate over 4 rounds so that a load spike on the machine hits both alike."""
        fresh = iter([query(_goal(rng), _observation(rng)) + f" [{i}]" for i in range(2 * n + 64)])
        rounds, per_round = 4, n // 4
        texts = [next(fresh) for _ in range(64)]
        t = time.perf_counter()
        for text in texts[:32]:
            embedder.embed([text])
        one = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(32, 64, 16):
            embedder.embed(texts[i : i + 16])
        self._say(
            f"embedding alone, fresh texts: batches of 16 are {one / (time.perf_counter() - t):.1f}x faster"
        )
        elapsed = {"one at a time": 0.0, "micro-batched": 0.0}
        batches = queries = 0
        for _ in range(rounds):
            with self._manager(run_id, embedder, batch_size=1, workers=1) as manager:
                manager.retrieve(["warm up"], SCOPE)
                texts = [next(fresh) for _ in range(per_round)]
                t = time.perf_counter()
                for text in texts:
                    manager.retrieve([text], SCOPE)
                elapsed["one at a time"] += time.perf_counter() - t
            with self._manager(run_id, embedder) as manager:
                manager.retrieve(["warm up"] * 8, SCOPE)
                texts = [next(fresh) for _ in range(per_round)]
                b0 = manager.stats.batches
                t = time.perf_counter()
                manager.retrieve(texts, SCOPE)
                elapsed["micro-batched"] += time.perf_counter() - t
                batches, queries = batches + manager.stats.batches - b0, queries + len(texts)
        mean_batch = queries / batches
        single_rate = rounds * per_round / elapsed["one at a time"]
        batch_rate = rounds * per_round / elapsed["micro-batched"]
        self._say(
            f"throughput, fresh queries: one at a time {single_rate:.0f} q/s; "
            f"micro-batched {batch_rate:.0f} q/s ({batch_rate / single_rate:.1f}x, "
            f"mean batch {mean_batch:.1f})"
        )
        # Many callers at once (rollout workers), each waiting for its own answer.
        callers = [query(_goal(rng), _observation(rng)) + f" ({i})" for i in range(n)]
        with self._manager(run_id, embedder) as manager:
            manager.retrieve(["warm up"] * 8, SCOPE)
            chunks = [callers[i::32] for i in range(32)]
            threads = [
                threading.Thread(target=lambda c=c: [manager.retrieve([q], SCOPE) for q in c]) for c in chunks
            ]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            concurrent = n / (time.perf_counter() - t)
        self._say(
            f"throughput, 32 concurrent callers: {concurrent:.0f} q/s ({concurrent / single_rate:.1f}x)"
        )

    def _recall(self, run_id, embedder, vectors: np.ndarray, rng, n: int, efs: list[int]) -> None:
        """HNSW top-1 (by distance, no re-rank) against an exact scan of the same float32 vectors."""
        queries = embedder.embed([query(_goal(rng), _observation(rng)) for _ in range(n // 2)])
        near = vectors[rng.sample(range(len(vectors)), n - len(queries))]  # queries close to stored entries
        near = near + np.random.default_rng(1).standard_normal(near.shape).astype(np.float32) * 0.02
        queries = np.vstack([queries, near / np.linalg.norm(near, axis=1, keepdims=True)])
        exact_best = (queries @ vectors.T).max(axis=1)
        sql = (
            f"SELECT id, 1 - (embedding <=> %s::vector) FROM {Experience._meta.db_table} "
            "WHERE run_id = %s AND scope = %s AND deleted_at IS NULL "
            "ORDER BY embedding <=> %s::vector LIMIT 1"
        )
        kinds = {"task queries": slice(0, n // 2), "near-entry queries": slice(n // 2, n)}
        results = []
        for ef in efs:
            hits, times = np.zeros(len(queries), dtype=bool), []
            with connection.cursor() as cursor:
                cursor.execute(f"SET hnsw.ef_search = {ef}")
                for i, (q, best) in enumerate(zip(queries, exact_best, strict=True)):
                    text = str([float(x) for x in q])
                    t = time.perf_counter()
                    cursor.execute(sql, [text, run_id, SCOPE, text])
                    _, sim = cursor.fetchone()
                    times.append((time.perf_counter() - t) * 1000)
                    hits[i] = abs(sim - best) < 1e-5  # the exact top-1 (or an exact tie with it)
            by_kind = ", ".join(f"{kind} {hits[part].mean():.3f}" for kind, part in kinds.items())
            results.append(f"  ef_search={ef}: {hits.mean():.3f} ({by_kind}); p50 {_pct(times, 50):.2f} ms")
        self._say(f"HNSW recall@1 vs exact scan over {len(queries)} queries:\n" + "\n".join(results))

    def _cache_stream(self, run_id: int, embedder: Embedder, rng: random.Random) -> None:
        """20 steps × 16 task instances × K/2 = 4 guided rollouts, tasks drawn from a pool of 400;
        through the batching manager (a step's queries at once) and one query at a time, cache cleared."""
        pool = [query(_goal(rng), _observation(rng)) + f" #{i}" for i in range(400)]
        steps = [[q for q in rng.sample(pool, 16) for _ in range(4)] for _ in range(20)]
        rates = {}
        for mode, kwargs in (("one at a time", {"batch_size": 1, "workers": 1}), ("micro-batched", {})):
            embedder.clear_cache()
            embedder.reset_stats()
            with self._manager(run_id, embedder, **kwargs) as manager:
                t = time.perf_counter()
                for step in steps:
                    if kwargs:
                        for q in step:
                            manager.retrieve([q], SCOPE)
                    else:
                        manager.retrieve(step, SCOPE)
                elapsed = time.perf_counter() - t
                rates[mode] = 1280 / elapsed
                self._say(
                    f"group-rollout stream, {mode}: {rates[mode]:.0f} q/s, "
                    f"{elapsed / 20 * 1000:.0f} ms of retrieval per step of 64; "
                    f"embedding cache hit rate {embedder.hit_rate:.1%}; {manager.stats.searches} SQL searches"
                )
        gain = rates["micro-batched"] / rates["one at a time"]
        self._say(f"group-rollout stream: micro-batched / one at a time = {gain:.1f}x")

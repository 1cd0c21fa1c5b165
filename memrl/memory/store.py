"""Namespaced long-term memory for the MemoryUpdate agent: insert, update, delete, search.

A *namespace* is one independent memory. The trainer creates a base namespace per
conversation (its initial memory), then forks one *trial* namespace per rollout
(`f"{base}--{request_id}"`); the agent edits only its trial, and the reward compares QA over
the base against QA over the trial. So forking must be cheap (thousands of trials) and trials
must never see each other's edits or change the base.

How that is guaranteed: a `MemoryRecord` is frozen and its embedding array read-only; an
update *replaces* the record. A fork is then a shallow copy of the base's id → record dict
(plus a shared, read-only embedding matrix cache), and every operation looks ids up only in
the namespace it is given.

Backends: `MemoryBackend` is the protocol the agent loop and tool layer program against.
`MemoryStore` is the embedded in-process backend (one lock, embedding done outside it).
`memrl.memory.ray_store.RayMemoryStore` is the same store in a Ray actor
(`MemoryStoreManager`) serving rollout workers in other processes; a vector database could
implement the protocol too, without touching the callers.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from memrl.errors import MemrlInputError
from memrl.memory.embedder import Embedder, l2_normalize

NAMESPACE_MAX_LENGTH = 200
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
WINDOWS_RESERVED_NAMES = frozenset(
    {"CON", "PRN", "AUX", "NUL"}
    | {f"COM{i}" for i in range(10)}
    | {f"LPT{i}" for i in range(10)}
)
"""Device names Windows refuses as file names, with any extension (`nul.txt`), any case.
`COM0`/`LPT0` are included: current Windows documentation lists them too."""
FORK_SEPARATOR = "--"


class MemoryStoreError(ValueError):
    """An operation the store cannot do (unknown namespace or id, empty text, bad top_k).

    The tool layer turns these into messages for the model, so the message must make sense
    to it: say what was wrong, not where in the code.
    """


@dataclass(frozen=True, eq=False)
class MemoryRecord:
    """One memory entry. Never mutated: `update` stores a new record under the same id."""

    id: str
    text: str
    embedding: np.ndarray = field(repr=False)
    created_step: int
    updated_step: int
    source: str

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryRecord):
            return NotImplemented
        return (
            (self.id, self.text, self.created_step, self.updated_step, self.source)
            == (other.id, other.text, other.created_step, other.updated_step, other.source)
            and np.array_equal(self.embedding, other.embedding)
        )

    __hash__ = None  # type: ignore[assignment]


def validate_namespace(name: object) -> str:
    """`name` if it is a safe namespace name, else MemrlInputError.

    ASCII letters, digits and `._:-`, starting with a letter or digit, at most 200
    characters, no `..`, and not a Windows device name (`CON`, `PRN`, `AUX`, `NUL`,
    `COM0`-`COM9`, `LPT0`-`LPT9`, in any case, alone or before `.`/`:`: `nul.txt`): safe as a
    file name, a Ray actor key or a collection name, and no look-alike Unicode (fullwidth
    letters, zero-width or bidi characters) can slip through.
    """
    if not isinstance(name, str):
        raise MemrlInputError(f"namespace must be a string, got {type(name).__name__}")
    shown = repr(name[:60]) + ("..." if len(name) > 60 else "")
    if not name:
        raise MemrlInputError("namespace must not be empty")
    if len(name) > NAMESPACE_MAX_LENGTH:
        raise MemrlInputError(
            f"namespace {shown} has {len(name)} characters, at most {NAMESPACE_MAX_LENGTH}"
        )
    if ".." in name:
        raise MemrlInputError(f"namespace {shown} must not contain '..'")
    if _NAMESPACE.fullmatch(name) is None:
        raise MemrlInputError(
            f"namespace {shown} must start with an ASCII letter or digit and contain only "
            "ASCII letters, digits and . _ : -"
        )
    stem = re.split(r"[.:]", name, maxsplit=1)[0].upper()  # Windows reads `NUL:` as NUL too
    if stem in WINDOWS_RESERVED_NAMES:
        raise MemrlInputError(
            f"namespace {shown} is a reserved device name on Windows ({stem}), which cannot "
            "be a file name there; choose another name"
        )
    return name


@runtime_checkable
class MemoryBackend(Protocol):
    """What the agent loop and the tool layer need from a memory store."""

    def create_namespace(
        self,
        ns: str,
        texts: Sequence[str] = (),
        *,
        sources: Sequence[str] | None = None,
        embeddings: np.ndarray | None = None,
        step: int = 0,
    ) -> list[str]: ...

    def fork(self, base_ns: str, request_id: str) -> str: ...

    def release(self, ns: str, *, missing_ok: bool = False) -> None: ...

    def exists(self, ns: str) -> bool: ...

    def namespaces(self) -> list[str]: ...

    def insert(self, ns: str, text: str, *, step: int = 0, source: str = "agent") -> str: ...

    def update(self, ns: str, id: str, text: str, *, step: int = 0) -> MemoryRecord: ...

    def delete(self, ns: str, id: str) -> MemoryRecord: ...

    def get(self, ns: str, id: str) -> MemoryRecord: ...

    def search(
        self, ns: str, query: str, top_k: int = 5
    ) -> list[tuple[MemoryRecord, float]]: ...

    def search_many(
        self, ns: str, queries: Sequence[str], top_k: int = 5
    ) -> list[list[tuple[MemoryRecord, float]]]: ...

    def stats(self, ns: str) -> dict[str, int]: ...

    def list(self, ns: str) -> list[MemoryRecord]: ...


class _Namespace:
    """One namespace's state. `records` keeps insertion order, which is also id order."""

    __slots__ = ("records", "next_id", "inserts", "updates", "deletes", "_matrix")

    def __init__(self, records: dict[str, MemoryRecord], next_id: int) -> None:
        self.records = records
        self.next_id = next_id
        self.inserts = 0
        self.updates = 0
        self.deletes = 0
        self._matrix: tuple[tuple[MemoryRecord, ...], np.ndarray] | None = None

    def changed(self) -> None:
        self._matrix = None

    def matrix(self, dim: int) -> tuple[tuple[MemoryRecord, ...], np.ndarray]:
        """(records, their stacked embeddings), cached until the next edit; read-only."""
        if self._matrix is None:
            recs = tuple(self.records.values())
            mat = (
                np.stack([r.embedding for r in recs])
                if recs
                else np.zeros((0, dim), dtype=np.float32)
            )
            mat.flags.writeable = False
            self._matrix = (recs, mat)
        return self._matrix

    def fork(self) -> _Namespace:
        child = _Namespace(dict(self.records), self.next_id)
        child._matrix = self._matrix  # immutable, so shared until either side edits
        return child


def _id_order(record_id: str) -> tuple[int, int | str]:
    """Sort key putting m2 before m10 (ids are `m{counter}`); other ids after, by text."""
    if record_id[:1] == "m" and record_id[1:].isdigit():
        return (0, int(record_id[1:]))
    return (1, record_id)


class MemoryStore:
    """The embedded, in-process `MemoryBackend`: a dict of namespaces behind one lock.

    Embedding (the slow part) runs outside the lock, so threads editing different trial
    namespaces only serialise on the dict updates. Ids are `m0, m1, ...` per namespace; a
    fork continues its base's counter, so a trial's new ids never reuse a base id and ids are
    never reused after a delete.
    """

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.dim = int(embedder.dim)
        self._spaces: dict[str, _Namespace] = {}
        self._lock = threading.Lock()

    # ---- namespaces -------------------------------------------------------------------

    def create_namespace(
        self,
        ns: str,
        texts: Sequence[str] = (),
        *,
        sources: Sequence[str] | None = None,
        embeddings: np.ndarray | None = None,
        step: int = 0,
    ) -> list[str]:
        """A new namespace holding `texts` (ids m0..m{n-1}, returned).

        `embeddings` lets the trainer reuse vectors computed ahead (`prepare --embed`); they
        must be one finite row of `dim` per text, and are re-normalised to unit length.
        `sources` defaults to "initial" for every text.
        """
        validate_namespace(ns)
        if isinstance(texts, str):
            raise MemoryStoreError("texts must be a sequence of strings, not one string")
        texts = [_check_text(t, f"text {i}") for i, t in enumerate(texts)]
        if sources is None:
            sources = ["initial"] * len(texts)
        else:
            sources = [str(s) for s in sources]
            if len(sources) != len(texts):
                raise MemoryStoreError(
                    f"got {len(sources)} sources for {len(texts)} texts in namespace {ns!r}"
                )
        with self._lock:
            if ns in self._spaces:
                raise MemoryStoreError(f"namespace {ns!r} already exists")
        if embeddings is None:
            vectors = self._embed(texts)
        else:
            vectors = np.asarray(embeddings, dtype=np.float32)
            if vectors.shape != (len(texts), self.dim):
                raise MemoryStoreError(
                    f"embeddings for namespace {ns!r} have shape {vectors.shape}, expected "
                    f"({len(texts)}, {self.dim}) (one row per text, embedder "
                    f"{self.embedder.name!r})"
                )
            if not np.all(np.isfinite(vectors)):
                raise MemoryStoreError(f"embeddings for namespace {ns!r} contain NaN or inf")
            vectors = l2_normalize(vectors)
        records = {}
        for i, (text, source) in enumerate(zip(texts, sources, strict=True)):
            rid = f"m{i}"
            records[rid] = _record(rid, text, vectors[i], step, step, source)
        with self._lock:
            if ns in self._spaces:
                raise MemoryStoreError(f"namespace {ns!r} already exists")
            self._spaces[ns] = _Namespace(records, len(texts))
        return list(records)

    def fork(self, base_ns: str, request_id: str) -> str:
        """Trial namespace `f"{base_ns}--{request_id}"`: a copy of the base, O(records)."""
        if not isinstance(request_id, str) or not request_id:
            raise MemrlInputError(f"request_id must be a non-empty string, got {request_id!r}")
        trial = validate_namespace(f"{base_ns}{FORK_SEPARATOR}{request_id}")
        with self._lock:
            base = self._space(base_ns)
            if trial in self._spaces:
                raise MemoryStoreError(f"namespace {trial!r} already exists")
            self._spaces[trial] = base.fork()
        return trial

    def release(self, ns: str, *, missing_ok: bool = False) -> None:
        """Delete a namespace (its forks, being copies, live on)."""
        with self._lock:
            if self._spaces.pop(ns, None) is None and not missing_ok:
                raise MemoryStoreError(f"unknown namespace {ns!r}")

    def exists(self, ns: str) -> bool:
        with self._lock:
            return ns in self._spaces

    def namespaces(self) -> list[str]:
        """All namespace names, sorted."""
        with self._lock:
            return sorted(self._spaces)

    # ---- records ------------------------------------------------------------------------

    def insert(self, ns: str, text: str, *, step: int = 0, source: str = "agent") -> str:
        """Add a memory; returns its new id."""
        text = _check_text(text, "memory text")
        self._check_namespace(ns)
        vector = self._embed([text])[0]
        with self._lock:
            space = self._space(ns)
            rid = f"m{space.next_id}"
            space.next_id += 1
            space.records[rid] = _record(rid, text, vector, step, step, source)
            space.inserts += 1
            space.changed()
        return rid

    def update(self, ns: str, id: str, text: str, *, step: int = 0) -> MemoryRecord:
        """Replace the text of memory `id` (keeps its id, creation step and source)."""
        text = _check_text(text, "memory text")
        with self._lock:
            self._record_in(self._space(ns), ns, id)
        vector = self._embed([text])[0]
        with self._lock:
            space = self._space(ns)
            old = self._record_in(space, ns, id)  # again: it may have gone while we embedded
            new = _record(id, text, vector, old.created_step, step, old.source)
            space.records[id] = new
            space.updates += 1
            space.changed()
        return new

    def delete(self, ns: str, id: str) -> MemoryRecord:
        """Remove memory `id`; returns the removed record."""
        with self._lock:
            space = self._space(ns)
            old = self._record_in(space, ns, id)
            del space.records[id]
            space.deletes += 1
            space.changed()
        return old

    def get(self, ns: str, id: str) -> MemoryRecord:
        with self._lock:
            return self._record_in(self._space(ns), ns, id)

    def search(self, ns: str, query: str, top_k: int = 5) -> list[tuple[MemoryRecord, float]]:
        """The `top_k` memories most similar to `query` (cosine), best first, ties by id."""
        return self.search_many(ns, [query], top_k)[0]

    def search_many(
        self, ns: str, queries: Sequence[str], top_k: int = 5
    ) -> list[list[tuple[MemoryRecord, float]]]:
        """`search` for several queries, embedded in one batch (for QA over a namespace)."""
        if isinstance(queries, str):
            raise MemoryStoreError("queries must be a sequence of strings, not one string")
        queries = [_check_text(q, f"query {i}") for i, q in enumerate(queries)]
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise MemoryStoreError(f"top_k must be an integer >= 1, got {top_k!r}")
        self._check_namespace(ns)
        q = self._embed(queries)
        with self._lock:
            records, matrix = self._space(ns).matrix(self.dim)
        if not records:
            return [[] for _ in queries]
        n = len(records)
        scores = q @ matrix.T  # rows are unit vectors: dot product = cosine
        results = []
        for row in scores:
            if top_k < n:
                # Every record scoring at least the k-th best (ties included), then exact order.
                kth = np.partition(row, n - top_k)[n - top_k]
                candidates = np.flatnonzero(row >= kth)
            else:
                candidates = np.arange(n)
            ranked = sorted(candidates, key=lambda j: (-row[j], _id_order(records[j].id)))
            results.append([(records[j], float(row[j])) for j in ranked[:top_k]])
        return results

    def stats(self, ns: str) -> dict[str, int]:
        """Size of the memory and the edits made since it was created or forked."""
        with self._lock:
            space = self._space(ns)
            texts = [r.text for r in space.records.values()]
            inserts, updates, deletes = space.inserts, space.updates, space.deletes
        return {
            "count": len(texts),
            "chars": sum(len(t) for t in texts),
            "tokens": sum(len(t.split()) for t in texts),
            "inserts": inserts,
            "updates": updates,
            "deletes": deletes,
        }

    def list(self, ns: str) -> list[MemoryRecord]:
        """Every memory of the namespace, in id order."""
        with self._lock:
            return [*self._space(ns).records.values()]

    # ---- helpers ----------------------------------------------------------------------

    def _embed(self, texts: list[str]) -> np.ndarray:
        vectors = np.asarray(self.embedder.embed(texts), dtype=np.float32)
        if vectors.shape != (len(texts), self.dim):
            raise RuntimeError(
                f"embedder {self.embedder.name!r} returned shape {vectors.shape}, "
                f"expected ({len(texts)}, {self.dim})"
            )
        return vectors

    def _check_namespace(self, ns: str) -> None:
        """Fail fast (before embedding) on an unknown namespace."""
        with self._lock:
            self._space(ns)

    def _space(self, ns: str) -> _Namespace:
        """Caller holds the lock."""
        space = self._spaces.get(ns) if isinstance(ns, str) else None
        if space is None:
            raise MemoryStoreError(f"unknown namespace {ns!r}")
        return space

    @staticmethod
    def _record_in(space: _Namespace, ns: str, id: Any) -> MemoryRecord:
        record = space.records.get(id) if isinstance(id, str) else None
        if record is None:
            raise MemoryStoreError(f"no memory with id {id!r} in this memory")
        return record


def _check_text(text: object, what: str) -> str:
    if not isinstance(text, str):
        raise MemoryStoreError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise MemoryStoreError(f"{what} must not be empty")
    return text


def _record(
    rid: str, text: str, vector: np.ndarray, created: int, updated: int, source: str
) -> MemoryRecord:
    vector = np.array(vector, dtype=np.float32)  # own copy, then frozen
    vector.flags.writeable = False
    return MemoryRecord(rid, text, vector, int(created), int(updated), str(source))


"""One memory store served by a Ray actor to rollout workers in other processes (memrl[ray]).

    store = RayMemoryStore.start(embedder, name="memrl-memory")   # once: the manager actor
    create_base_namespace(store, episode)                          # a base per conversation
    ... hand `store` to Ray tasks or actors (it pickles as the actor's handle), or
    store = RayMemoryStore.connect("memrl-memory") in a process of the same Ray job ...
    MemoryUpdateAgent(generator, store, config).run(episodes)     # the agent, unchanged
    store.shutdown()

This is the MemoryUpdate workflow's design: one `MemoryStoreManager` actor holds every
namespace (a base per conversation, a trial fork per rollout) and rollout workers anywhere in
the cluster edit their own trials through it. `RayMemoryStore` is a `MemoryBackend`: the
agent, the tool layer and the reward call the same methods as on the in-process
`MemoryStore`, and get the same results and the same `MemoryStoreError`s (unwrapped from Ray's
task error, so a tool's error message to the model is the store's own).

Isolation is the MemoryStore's: each operation looks ids up only in the namespace it names and
a fork is a copy, so trials stay apart across processes as they do across threads. The actor
runs `max_concurrency` calls at once on threads (the store embeds outside its lock). Every
call waits at most `timeout_s` for the actor, then raises TimeoutError: a dead or stuck actor
never hangs a rollout worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memrl.errors import require
from memrl.memory.embedder import Embedder
from memrl.memory.store import MemoryRecord, MemoryStore

__all__ = [
    "MemoryStoreManager", "PrefixedStore", "RayMemoryStore", "RemoteEmbedder", "shared_store",
]

FEATURE = "the Ray memory store"


class MemoryStoreManager(MemoryStore):
    """What the actor holds: a `MemoryStore` that also embeds for its clients."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The store's embedder on `texts` (for a client's `embedder.embed`)."""
        return np.asarray(self.embedder.embed(list(texts)), dtype=np.float32)

    def embedder_info(self) -> tuple[str, int]:
        return self.embedder.name, self.dim


class RemoteEmbedder:
    """The manager's embedder seen from a client: the same name and dim, embedding in the
    actor (precomputed-embedding lookups fall back to it, as to a local embedder)."""

    def __init__(self, store: RayMemoryStore, name: str, dim: int) -> None:
        self.store = store
        self.name = name
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.store.call("embed", list(texts))


class RayMemoryStore:
    """A `MemoryBackend` whose namespaces live in a `MemoryStoreManager` Ray actor."""

    def __init__(self, actor: Any, *, timeout_s: float = 300.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.actor = actor
        self.timeout_s = float(timeout_s)
        name, dim = self.call("embedder_info")
        self.embedder = RemoteEmbedder(self, name, dim)
        self.dim = dim

    @classmethod
    def start(
        cls,
        embedder: Embedder,
        *,
        name: str | None = None,
        max_concurrency: int = 8,
        num_cpus: float = 0.0,
        timeout_s: float = 300.0,
    ) -> RayMemoryStore:
        """Start the manager actor (on the connected Ray cluster) and return a client.

        `name` registers the actor so other processes of the job can `connect` to it;
        `num_cpus` is what Ray reserves for it (0: it shares its node's CPUs)."""
        ray = require("ray", extra="ray", feature=FEATURE)
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        options: dict[str, Any] = {"max_concurrency": int(max_concurrency),
                                   "num_cpus": float(num_cpus)}
        if name is not None:
            options["name"] = name
        actor = ray.remote(MemoryStoreManager).options(**options).remote(embedder)
        return cls(actor, timeout_s=timeout_s)

    @classmethod
    def connect(cls, name: str, *, timeout_s: float = 300.0) -> RayMemoryStore:
        """A client of the manager actor started under `name` in this Ray job."""
        ray = require("ray", extra="ray", feature=FEATURE)
        try:
            actor = ray.get_actor(name)
        except ValueError:
            raise ValueError(f"no memory store actor named {name!r} in this Ray job") from None
        return cls(actor, timeout_s=timeout_s)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method(*args, **kwargs)` on the actor's store; its exceptions raised as they are."""
        import ray
        from ray.exceptions import GetTimeoutError, RayTaskError

        ref = getattr(self.actor, method).remote(*args, **kwargs)
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except GetTimeoutError:
            raise TimeoutError(
                f"the memory store actor did not answer {method} within {self.timeout_s:g} s"
            ) from None
        except RayTaskError as exc:
            if isinstance(exc.cause, Exception):
                raise exc.cause from None
            raise

    def shutdown(self) -> None:
        """Stop the actor (every client's namespaces go with it)."""
        import ray

        ray.kill(self.actor)

    # ---- MemoryBackend ----------------------------------------------------------------

    def create_namespace(self, ns: str, texts: Sequence[str] = (), **options: Any) -> list[str]:
        """`MemoryStore.create_namespace` in the actor (`options`: its sources, embeddings,
        step)."""
        return self.call("create_namespace", ns, texts if isinstance(texts, str) else
                         list(texts), **options)

    def fork(self, base_ns: str, request_id: str) -> str:
        return self.call("fork", base_ns, request_id)

    def release(self, ns: str, *, missing_ok: bool = False) -> None:
        return self.call("release", ns, missing_ok=missing_ok)

    def exists(self, ns: str) -> bool:
        return self.call("exists", ns)

    def namespaces(self) -> list[str]:
        return self.call("namespaces")

    def insert(self, ns: str, text: str, *, step: int = 0, source: str = "agent") -> str:
        return self.call("insert", ns, text, step=step, source=source)

    def update(self, ns: str, id: str, text: str, *, step: int = 0) -> MemoryRecord:
        return self.call("update", ns, id, text, step=step)

    def delete(self, ns: str, id: str) -> MemoryRecord:
        return self.call("delete", ns, id)

    def get(self, ns: str, id: str) -> MemoryRecord:
        return self.call("get", ns, id)

    def search(self, ns: str, query: str, top_k: int = 5) -> list[tuple[MemoryRecord, float]]:
        return self.call("search", ns, query, top_k)

    def search_many(
        self, ns: str, queries: Sequence[str], top_k: int = 5
    ) -> list[list[tuple[MemoryRecord, float]]]:
        return self.call("search_many", ns, queries if isinstance(queries, str) else
                         list(queries), top_k)

    def stats(self, ns: str) -> dict[str, int]:
        return self.call("stats", ns)

    def list(self, ns: str) -> list[MemoryRecord]:
        return self.call("list", ns)


class PrefixedStore:
    """A `MemoryBackend` view of `backend` in which every namespace is `prefix + name`: several
    trainers (the ranks of one run) share one store actor without their base and trial
    namespaces ever meeting, while each sees the names it asked for. `embedder` is the
    backend's."""

    def __init__(self, backend: Any, prefix: str) -> None:
        self.backend = backend
        self.prefix = prefix
        self.embedder = getattr(backend, "embedder", None)

    def _own(self, ns: str) -> str:
        return ns[len(self.prefix):] if ns.startswith(self.prefix) else ns

    def create_namespace(self, ns: str, texts: Sequence[str] = (), **kw: Any) -> list[str]:
        return self.backend.create_namespace(self.prefix + ns, texts, **kw)

    def fork(self, base_ns: str, request_id: str) -> str:
        return self._own(self.backend.fork(self.prefix + base_ns, request_id))

    def release(self, ns: str, *, missing_ok: bool = False) -> None:
        self.backend.release(self.prefix + ns, missing_ok=missing_ok)

    def exists(self, ns: str) -> bool:
        return self.backend.exists(self.prefix + ns)

    def namespaces(self) -> list[str]:
        return [self._own(n) for n in self.backend.namespaces() if n.startswith(self.prefix)]

    def insert(self, ns: str, text: str, **kw: Any) -> str:
        return self.backend.insert(self.prefix + ns, text, **kw)

    def update(self, ns: str, id: str, text: str, **kw: Any) -> MemoryRecord:
        return self.backend.update(self.prefix + ns, id, text, **kw)

    def delete(self, ns: str, id: str) -> MemoryRecord:
        return self.backend.delete(self.prefix + ns, id)

    def get(self, ns: str, id: str) -> MemoryRecord:
        return self.backend.get(self.prefix + ns, id)

    def search(self, ns: str, query: str, top_k: int = 5) -> list[tuple[MemoryRecord, float]]:
        return self.backend.search(self.prefix + ns, query, top_k)

    def search_many(self, ns: str, queries: Sequence[str], top_k: int = 5
                    ) -> list[list[tuple[MemoryRecord, float]]]:
        return self.backend.search_many(self.prefix + ns, queries, top_k)

    def stats(self, ns: str) -> dict[str, int]:
        return self.backend.stats(self.prefix + ns)

    def list(self, ns: str) -> list[MemoryRecord]:
        return self.backend.list(self.prefix + ns)


def shared_store(embedder: Embedder, name: str, prefix: str, *,
                 timeout_s: float = 300.0) -> PrefixedStore:
    """This trainer's view (`prefix`) of the store actor `name`, started by whichever trainer
    of the Ray job comes first (the others connect to it). Joins the Ray cluster of
    `RAY_ADDRESS` (or starts a local one) when this process is not connected yet: under
    `trainer.launcher: ray` the workers already are."""
    ray = require("ray", extra="ray", feature=FEATURE)
    if not ray.is_initialized():
        import os

        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False,
                 include_dashboard=False)
    try:
        store = RayMemoryStore.start(embedder, name=name, timeout_s=timeout_s)
    except ValueError:  # another trainer started it first
        store = RayMemoryStore.connect(name, timeout_s=timeout_s)
    return PrefixedStore(store, prefix)

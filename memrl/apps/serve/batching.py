"""Concurrent requests on an engine that answers one `generate` call at a time (HF).

The in-process Hugging Face engine has no request queue: its `agenerate` runs a whole
`generate` on the caller's thread. A server that ran it so would answer one turn at a time
and stall its event loop. `BatchingEngine` puts a queue in front of it: every `agenerate`
(one turn of one request's episode, `MemAgent.aread`) is queued, and one worker thread runs
what is queued as one batched `generate` call (turns asking for the same settings
together), then the next batch. So concurrent requests share the model's forward passes,
as vLLM's continuous batching shares its steps, and the event loop stays free to take new
requests, stream progress and answer /health.

The HF engine seeds a batch, not a request (`memrl.inference.base.batch_params`): a
request's sample depends on the requests beside it. A server's requests are not
reproducible anyway unless each asks for a seed and runs alone.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from memrl.inference.base import Generation, SamplingParams, check_prompts

GATHER_WAIT_S = 0.01
"""After a request arrives, the worker waits for more until none comes for this long (the
next turns of concurrent episodes come in a few milliseconds of each other: each encodes
its next prompt first)."""


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class BatchingEngine:
    """`generator` (an HFEngine) behind a request queue and one worker thread."""

    continuous_batching = True
    """Concurrent `agenerate` calls are batched: agents run their episodes as coroutines."""

    def __init__(self, generator: Any, *, max_batch_size: int = 64,
                 gather_wait_s: float = GATHER_WAIT_S) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.name_or_path = getattr(generator, "name_or_path", "")
        self.max_batch_size = max_batch_size
        self.gather_wait_s = gather_wait_s
        self.stats = {"calls": 0, "requests": 0, "largest_batch": 0}
        """`generate` calls and the requests they answered so far, and the most in one call
        (how well concurrent requests batch)."""
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._work, name="memrl-batching", daemon=True)
        self._worker.start()

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        """One request, answered in the next batch the worker runs."""
        check_prompts([prompt])
        if not self._worker.is_alive():
            raise RuntimeError("the batching engine is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.put(_Request(list(prompt), params, future, loop))
        return await future

    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams]) -> list[Generation]:
        """The wrapped engine's `generate`, never at the same time as a batch."""
        with self._lock:
            return self.generator.generate(prompts, params)

    def close(self) -> None:
        """Finish the queued requests, then stop the worker."""
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join()

    # ---- the worker thread

    def _work(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch_size:
                try:
                    item = self._queue.get(timeout=self.gather_wait_s)
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            groups: dict[SamplingParams, list[_Request]] = {}
            for request in batch:
                groups.setdefault(replace(request.params, seed=None), []).append(request)
            for requests in groups.values():
                self._run(requests)

    def _run(self, requests: list[_Request]) -> None:
        live = [r for r in requests if not r.future.cancelled()]
        if not live:
            return
        try:
            with self._lock:
                generations = self.generator.generate([r.prompt for r in live],
                                                      [r.params for r in live])
        except BaseException as exc:  # noqa: BLE001 - every waiting request gets the error
            for r in live:
                _call_in_loop(r.loop, _fail, r.future, exc)
            return
        self.stats["calls"] += 1
        self.stats["requests"] += len(live)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(live))
        for r, generation in zip(live, generations, strict=True):
            _call_in_loop(r.loop, _succeed, r.future, generation)


def _call_in_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nobody waits for this answer any more
        pass


def _succeed(future: asyncio.Future, generation: Generation) -> None:
    if not future.done():
        future.set_result(generation)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

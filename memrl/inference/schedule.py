"""Run agent episodes, each written once as a coroutine, on either schedule.

An agent writes one episode as `async def episode(calls) -> result`, awaiting every model
call through the object the driver gives it: `await calls.generate(prompt, params,
stage=...)` returns the `Generation`. `run_episodes(generator, episodes, mode)` runs a list
of such episodes (each a callable taking `calls`) and returns their results in order:

- async (`mode="async"`, or `auto` on an engine with `continuous_batching`: vLLM, the
  server pool): every episode is an asyncio task and each call is one
  `engine.agenerate(prompt, params)`, sent as soon as the episode asks for it; the engine
  batches whatever is in flight. `arun_episodes` is the same inside a running event loop
  (`MemAgent.aread`, `memrl.apps.ask`, `memrl.apps.serve`).
- lockstep (`mode="lockstep"`, or `auto` on the HF engine, which answers one call at a
  time): a trampoline without an event loop (`coroutine.send`). It runs every episode until
  each waits on a call (or has finished), then takes the waiting requests of the LOWEST
  `stage` only, sends them as one batched `generate` call per sampling setting
  (max_new_tokens, temperature, top_p, stop, ignore_eos: the HF engine samples a batch with
  one setting), requests in episode order, and resumes those episodes in episode order with
  their replies. Requests of a higher stage wait until no episode asks for a lower one.

`stage` (an int, default 0) is how an agent keeps the batches its lockstep schedule has
always made: MemAgent's memory updates are stage 0 and its final answers stage 1, so update
k of every episode that has a k-th chunk is one call and all final answers are one last
call (a batch whose longest context has K chunks makes K + 1 calls); MemoryUpdate asks
everything at stage 0, so each round is one call holding the next reply of every unfinished
episode. The async schedule ignores stages.

The schedule changes when a request is sent, never what it is: each request carries its own
seed (`memrl.inference.base.Sampler`), so on an engine that seeds each request on its own
both schedules give the same trajectories. The HF engine seeds a whole `generate` call from
its requests' seeds (`batch_params`), so its samples depend on which requests share a call:
the rule above keeps those calls what they were before agents were coroutines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from collections.abc import Generator as PyGenerator
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar

from memrl.inference.base import (
    Generation,
    Generator,
    RolloutMode,
    Sampler,
    SamplingParams,
    generate_checked,
    run_concurrently,
    runs_async,
)
from memrl.inference.chat import encode_chat
from memrl.trajectory import Turn, generated_turn

T = TypeVar("T")


@dataclass(frozen=True)
class Request:
    """One model call an episode waits on."""

    prompt: Sequence[int]
    params: SamplingParams
    stage: int = 0
    """Lockstep sends the waiting requests of the lowest stage first (module docstring)."""


class ModelCalls(Protocol):
    """What an episode awaits its model calls through."""

    def generate(
        self, prompt: Sequence[int], params: SamplingParams, *, stage: int = 0
    ) -> Awaitable[Generation]:
        """The reply to one request (`stage`: see the module docstring)."""
        ...


Episode = Callable[[ModelCalls], Coroutine[Any, Any, T]]
"""One episode: given the driver's `ModelCalls`, a coroutine returning its result."""


@dataclass(frozen=True)
class ProgressEvent:
    """What a rollout reports while it runs, for progress bars (one type for every agent).

    kind "start": `episodes` and `chunks` (where the agent reads chunks) are the totals
    this run will process.
    kind "chunks": one memory update just finished (`chunks` is 1).
    kind "final": one episode just finished (`episodes` is 1).
    Every event but "start" is one turn, on either schedule, given as `turn` (its text and
    token counts).
    """

    kind: Literal["start", "chunks", "final"]
    episodes: int = 0
    chunks: int = 0
    turn: Turn | None = None


class EpisodeModel:
    """The model as one episode sees it: `await generate(prompt, max_new_tokens=...)`.

    The driver, not the episode, seeds the requests: call t of the episode named `key`
    (record id, occurrence, sample index: `memrl.inference.base.episode_keys`) samples with
    `sampler.params(max_new_tokens, *key, t)`, whichever schedule runs it. Every call is
    kept as a Turn (`turns`, in order); `keep_ids=False` keeps only token counts.
    """

    def __init__(self, calls: ModelCalls, sampler: Sampler, key: tuple[str, int, int], *,
                 keep_ids: bool = True) -> None:
        self.calls = calls
        self.sampler = sampler
        self.key = key
        self.keep_ids = keep_ids
        self.turns: list[Turn] = []
        self.last: Generation | None = None
        """The Generation of the latest call (finish reason, token ids)."""

    @property
    def tokenizer(self) -> Any:
        return self.sampler.generator.tokenizer

    def chat(self, text: str) -> list[int]:
        """The prompt ids of one user message in the model's chat template."""
        return encode_chat(self.tokenizer, text)

    async def generate(self, prompt: Sequence[int], *, max_new_tokens: int, kind: str = "turn",
                       stage: int = 0, detail: Any = None) -> str:
        """The reply to `prompt` as text (what a next prompt sees), kept as a Turn of `kind`
        (`detail`: the agent's own record of it). `stage`: the lockstep order (above)."""
        params = self.sampler.params(max_new_tokens, *self.key, len(self.turns))
        self.last = await self.calls.generate(prompt, params, stage=stage)
        self.turns.append(generated_turn(kind, prompt, self.last, keep_ids=self.keep_ids,
                                         detail=detail))
        return self.sampler.text(self.last)


class AsyncCalls:
    """The async schedule's calls: each one `engine.agenerate`."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def generate(
        self, prompt: Sequence[int], params: SamplingParams, *, stage: int = 0
    ) -> Generation:
        return await self.engine.agenerate(prompt, params)


class _Waiting:
    """The awaitable of one lockstep call: it hands its request to the trampoline (through
    `coroutine.send`) and returns the reply the trampoline sends back."""

    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request

    def __await__(self) -> PyGenerator[Request, Generation, Generation]:
        return (yield self.request)


class LockstepCalls:
    """The lockstep schedule's calls: each one waits for the trampoline's next batch."""

    def generate(
        self, prompt: Sequence[int], params: SamplingParams, *, stage: int = 0
    ) -> Awaitable[Generation]:
        return _Waiting(Request(prompt, params, stage))


def run_episodes(
    generator: Generator, episodes: Sequence[Episode[T]], mode: RolloutMode = "auto"
) -> list[T]:
    """The episodes' results in order, on the schedule `mode` picks for `generator`
    (`memrl.inference.base.runs_async`)."""
    if runs_async(generator, mode):
        return asyncio.run(arun_episodes(generator, episodes))
    return run_lockstep(generator, episodes)


async def arun_episodes(engine: Any, episodes: Sequence[Episode[T]]) -> list[T]:
    """The async schedule inside a running event loop: every episode a task, every call one
    `agenerate`. The first failure cancels the other episodes and is raised."""
    calls = AsyncCalls(engine)
    return await run_concurrently(episode(calls) for episode in episodes)


def run_lockstep(generator: Generator, episodes: Sequence[Episode[T]]) -> list[T]:
    """The lockstep schedule (module docstring): rounds of batched `generate` calls, no
    event loop. The first failure closes the other episodes and is raised."""
    calls = LockstepCalls()
    coroutines = [episode(calls) for episode in episodes]
    results: dict[int, T] = {}
    waiting: dict[int, Request] = {}
    try:
        for i, coroutine in enumerate(coroutines):
            _resume(coroutine, i, None, waiting, results)
        while waiting:
            stage = min(r.stage for r in waiting.values())
            due = [i for i in sorted(waiting) if waiting[i].stage == stage]
            replies = _send(generator, [waiting.pop(i) for i in due])
            for i, reply in zip(due, replies, strict=True):
                _resume(coroutines[i], i, reply, waiting, results)
    except BaseException:
        for coroutine in coroutines:
            coroutine.close()
        raise
    return [results[i] for i in range(len(coroutines))]


def _send(generator: Generator, requests: list[Request]) -> list[Generation]:
    """One `generate` call per sampling setting (all but the seed), each in request order;
    the replies in request order."""
    groups: dict[SamplingParams, list[int]] = {}
    for n, request in enumerate(requests):
        groups.setdefault(replace(request.params, seed=None), []).append(n)
    replies: list[Generation | None] = [None] * len(requests)
    for members in groups.values():
        generations = generate_checked(
            generator, [requests[n].prompt for n in members], [requests[n].params for n in members]
        )
        for n, generation in zip(members, generations, strict=True):
            replies[n] = generation
    return replies  # type: ignore[return-value]


def _resume(coroutine: Coroutine[Any, Any, T], index: int, reply: Generation | None,
            waiting: dict[int, Request], results: dict[int, T]) -> None:
    """Run one episode until its next call (kept in `waiting`) or its end (its result)."""
    try:
        request = coroutine.send(reply)
    except StopIteration as stop:
        results[index] = stop.value
        return
    if not isinstance(request, Request):
        raise TypeError(
            "a lockstep episode may only await its calls.generate(...); episode "
            f"{index} awaited {request!r}"
        )
    waiting[index] = request

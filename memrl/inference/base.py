"""The seam every model call goes through: token ids in, token ids + logprobs out.

- `Generator`: what agents need — batched `generate` and a tokenizer.
- `Engine`: what training needs on top — `agenerate` (one request, awaitable), whether
  concurrent requests are batched continuously (`continuous_batching`), and the weight and
  memory hooks a separate inference engine (vLLM, a server pool) must have:
  `sync_weights(policy, step)` before each rollout, `sleep()` during the update, `wake()`
  before the next rollout. The in-process Hugging Face engine generates with the module being
  trained, so for it these are no-ops.
- `Sampler`: the sampling settings of one agent run, each request with its own
  reproducible seed (one place for seeding). How an agent's episodes are scheduled onto
  these protocols is `memrl.inference.schedule`.

Seeds. A request is a prompt with its `SamplingParams`, and samples with `params.seed`:
`agenerate(prompt, params)` is one request, and so is prompt i of
`generate(prompts, [params_0, params_1, ...])` (one SamplingParams per prompt). With one
SamplingParams for a whole call, `generate(prompts, params)` is shorthand for the per-prompt
list `request_params(prompts, params)`: prompt i gets `derive_seed(params.seed, i)`, so the
samples of a GRPO group (one prompt repeated) differ. Engines that seed every request on its
own (vLLM, the server pool) so give a request the same sample whether it came alone through
`agenerate` or inside a batch; the in-process HF engine can only seed a whole batch
(`batch_params`: one seed hashed from the requests' seeds), so its samples also depend on
which requests share the call.

Agents key their requests by what they are, not by when they run: the Sampler gives the
request of turn t of episode (record id, occurrence, sample index) the seed
`derive_seed(agent seed, record id, occurrence, sample index, t)`. The lockstep schedule
(batched `generate` calls over every episode waiting on the engine) and the async one (each
episode awaiting `agenerate`) therefore send every request with the same seed, and on a
per-request-seeded engine give the same trajectories (`memrl.inference.schedule`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar, get_args, runtime_checkable

T = TypeVar("T")

SEED_BITS = 63
"""Derived seeds lie in [0, 2**63): valid for torch, numpy (via SeedSequence) and vLLM."""
SEED_MAX = 2**SEED_BITS - 1
"""The largest seed a config accepts (torch's generators take 64-bit signed integers)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response per prompt."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    """Generation stops after the first of these strings; the string is kept in the text."""
    seed: int | None = None
    ignore_eos: bool = False
    """Keep sampling past EOS until max_new_tokens (verl rollout.ignore_eos): every response
    has exactly max_new_tokens tokens unless a stop string ends it. For benchmarks, whose
    random-weight models would otherwise stop at a random EOS."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    """One sampled response."""

    token_ids: list[int]
    logprobs: list[float]
    """log p(token) under softmax(logits / temperature) (raw logits when greedy), before top-p."""
    text: str
    finish_reason: str = "stop"
    """"stop" (EOS or a stop string) or "length" (hit max_new_tokens)."""


@runtime_checkable
class Generator(Protocol):
    """Batched text generation. Implementations: HFEngine (in-process), scripted fakes."""

    tokenizer: Any
    """A Hugging Face tokenizer with a chat template: agents build prompts with it."""

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """Return one Generation per prompt, in order. `params`: one for every prompt, or
        one per prompt (see the module docstring for how each is seeded)."""
        ...


@runtime_checkable
class Engine(Generator, Protocol):
    """A Generator that a training recipe can drive: weights in, memory out, requests async."""

    continuous_batching: bool
    """True when requests of concurrent `agenerate` calls are batched together as they come
    (vLLM, a server pool): agents then run their episodes as independent coroutines
    (`rollout mode: auto`). False when each request is answered alone (the HF engine)."""

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        """One request, seeded with `params.seed`; several may be in flight at once."""
        ...

    def sync_weights(self, policy: Any, step: int) -> None:
        """Make the engine sample from `policy`'s current weights (called before a rollout)."""
        ...

    def sleep(self) -> None:
        """Free the engine's accelerator memory (KV cache) while the policy is updated."""
        ...

    def wake(self) -> None:
        """Undo `sleep` before the next rollout."""
        ...

    def close(self) -> None:
        """Release the engine at the end of training, while the trainer's process group is
        still there (an in-process vLLM engine shuts its own groups down)."""
        ...


def derive_seed(*parts: int | str) -> int:
    """A seed in [0, 2**63) determined by `parts`, e.g. (run seed, step, round, call).

    Hashing (not adding) keeps seeds of different parts apart: seed + i schemes make round
    r's call i collide with round r+1's call i-1.
    """
    text = "/".join(str(p) for p in parts).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def request_params(
    prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    """The SamplingParams of each prompt of a `generate` call: a per-prompt list as given
    (its length checked); one SamplingParams for the call gives prompt i the seed
    `derive_seed(params.seed, i)` (None stays None)."""
    if isinstance(params, SamplingParams):
        if params.seed is None:
            return [params] * len(prompts)
        return [replace(params, seed=derive_seed(params.seed, i)) for i in range(len(prompts))]
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
    return params


def batch_params(
    prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> SamplingParams:
    """One SamplingParams for a whole call, for engines that can only seed a batch (HF).

    One SamplingParams is used as it is (its seed seeds the call). A per-prompt list must
    agree on everything but the seed; the call is seeded with a hash of the requests' seeds
    (None when none has one), so the same requests in the same order sample alike.
    """
    if isinstance(params, SamplingParams):
        return params
    each = request_params(prompts, params)
    if not each:
        return SamplingParams()
    first = replace(each[0], seed=None)
    for i, p in enumerate(each):
        if replace(p, seed=None) != first:
            raise ValueError(
                f"prompt {i} asks for other sampling settings than prompt 0: this engine "
                "samples a batch with one max_new_tokens, temperature, top_p and stop"
            )
    seeds = [p.seed for p in each]
    if all(s is None for s in seeds):
        return first
    return replace(first, seed=derive_seed("batch", *(str(s) for s in seeds)))


RolloutMode = Literal["auto", "lockstep", "async"]
"""How an agent schedules its episodes: `lockstep` (one `generate` call per step over every
running episode), `async` (each episode a coroutine awaiting `agenerate`), or `auto`
(async on engines with `continuous_batching`, lockstep otherwise)."""

ROLLOUT_MODES: tuple[str, ...] = get_args(RolloutMode)


def runs_async(generator: Generator, mode: str) -> bool:
    """Whether episodes on `generator` run as coroutines under rollout `mode`."""
    if mode not in ROLLOUT_MODES:
        raise ValueError(f"rollout mode must be one of {', '.join(ROLLOUT_MODES)}, got {mode!r}")
    if mode == "auto":
        return bool(getattr(generator, "continuous_batching", False))
    if mode == "async" and not hasattr(generator, "agenerate"):
        raise ValueError(
            f"rollout mode async needs an engine with agenerate; {type(generator).__name__} "
            "has none"
        )
    return mode == "async"


async def run_concurrently(coroutines: Iterable[Awaitable[T]]) -> list[T]:
    """Await `coroutines` concurrently; their results in order. The first failure cancels
    the others (awaiting their cancellation) and is raised as it is."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    """Every engine's precondition: each prompt has at least one token."""
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty: a causal LM needs at least one token")


def checked_requests(
    prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    """Where every engine's `generate` starts: each prompt has a token (`check_prompts`),
    and each gets its SamplingParams (`request_params`; none when there is no prompt)."""
    check_prompts(prompts)
    return request_params(prompts, params) if prompts else []


def generate_checked(
    generator: Generator,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams],
) -> list[Generation]:
    """`generator.generate`, with a clear error when it returns the wrong number of replies."""
    generations = generator.generate(prompts, params)
    if len(generations) != len(prompts):
        raise RuntimeError(
            f"generator returned {len(generations)} generations for {len(prompts)} prompts"
        )
    return generations


def response_text(tokenizer: Any, generation: Generation) -> str:
    """The response as text without EOS / special tokens: what the next prompt sees."""
    return tokenizer.decode(list(generation.token_ids), skip_special_tokens=True)


class Sampler:
    """The sampling settings of one agent run, and a seed per request.

    `params(max_new_tokens, *key)` is the SamplingParams of the request named `key` (an
    agent passes the episode key and the turn index): its seed is `derive_seed(seed, *key)`,
    the same whichever schedule sends it (`memrl.inference.schedule`). With `seed=None` the
    requests are unseeded (the generator's own randomness). `text(generation)` is a reply
    as the next prompt sees it (`response_text`).
    """

    def __init__(
        self, generator: Generator, *, temperature: float, top_p: float, seed: int | None
    ) -> None:
        self.generator = generator
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed

    def params(self, max_new_tokens: int, *key: int | str) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=None if self.seed is None else derive_seed(self.seed, *key),
        )

    def text(self, generation: Generation) -> str:
        return response_text(self.generator.tokenizer, generation)


def episode_keys(record_ids: Sequence[str], num_samples: int) -> list[tuple[str, int, int]]:
    """(record id, occurrence, sample index) of each episode of a run, record by record,
    samples 0..n-1: what names an episode whichever order it runs in. `occurrence` counts
    earlier copies of the same id in the run (a question stream that wrapped around), so
    copies sample apart."""
    seen: dict[str, int] = {}
    keys = []
    for rid in record_ids:
        occurrence = seen.get(rid, 0)
        seen[rid] = occurrence + 1
        keys += [(rid, occurrence, s) for s in range(num_samples)]
    return keys

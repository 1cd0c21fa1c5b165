"""The seam every model call goes through: token ids in, token ids + logprobs out.

- `Generator`: what agents need — batched `generate` and a tokenizer.
- `Engine`: what training needs on top — `agenerate` (one request, awaitable), and the
  weight and memory hooks a separate inference engine (vLLM, a server pool) must have:
  `sync_weights(policy, step)` before each rollout, `sleep()` during the update, `wake()`
  before the next rollout. The in-process Hugging Face engine generates with the module being
  trained, so for it these are no-ops.
- `Sampler`: numbered generate calls with a distinct, reproducible seed for each call, which
  both agents use (one place for seeding, batching checks and decoding).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

SEED_BITS = 63
"""Derived seeds lie in [0, 2**63): valid for torch, numpy (via SeedSequence) and vLLM."""


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
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Generator(Protocol):
    """Batched text generation. Implementations: HFGenerator (in-process), scripted fakes."""

    tokenizer: Any
    """A Hugging Face tokenizer with a chat template: agents build prompts with it."""

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        """Return one Generation per prompt, in order."""
        ...


@runtime_checkable
class Engine(Generator, Protocol):
    """A Generator that a training recipe can drive: weights in, memory out, requests async."""

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        """One request; several may be in flight at once (continuous batching)."""
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


def derive_seed(*parts: int | str) -> int:
    """A seed in [0, 2**63) determined by `parts`, e.g. (run seed, step, round, call).

    Hashing (not adding) keeps seeds of different parts apart: seed + i schemes make round
    r's call i collide with round r+1's call i-1.
    """
    text = "/".join(str(p) for p in parts).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    """Every engine's precondition: each prompt has at least one token."""
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty: a causal LM needs at least one token")


def generate_checked(
    generator: Generator, prompts: Sequence[Sequence[int]], params: SamplingParams
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
    """Numbered generate calls: call i samples with seed `derive_seed(seed, i)`.

    With `seed=None` the calls are unseeded (the generator's own randomness).
    """

    def __init__(
        self, generator: Generator, *, temperature: float, top_p: float, seed: int | None
    ) -> None:
        self.generator = generator
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.calls = 0

    def __call__(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int
    ) -> list[Generation]:
        seed = None if self.seed is None else derive_seed(self.seed, self.calls)
        self.calls += 1
        params = SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed,
        )
        return generate_checked(self.generator, prompts, params)

    def text(self, generation: Generation) -> str:
        return response_text(self.generator.tokenizer, generation)

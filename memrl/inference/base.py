"""The one interface every model call goes through: token ids in, token ids + logprobs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
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

"""A Generator whose answers come from a Python function: for tests and dry runs.

It goes through the real tokenizer (prompts are decoded, responses encoded), so everything
downstream sees exactly the token ids a model would have produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memrl.inference.base import Generation, SamplingParams, request_params


class ScriptedGenerator:
    """Respond to each prompt with `respond(prompt_text)`, truncated to max_new_tokens."""

    def __init__(self, tokenizer: Any, respond: Callable[[str], str], *,
                 end_with_eos: bool = False) -> None:
        """`end_with_eos`: a response that fits max_new_tokens ends with the tokenizer's
        end-of-turn token (in `token_ids`, not in `text`), as a model's would: a model
        fine-tuned on it learns to stop (a scripted teacher for a warm start)."""
        self.tokenizer = tokenizer
        self.respond = respond
        self.end_with_eos = end_with_eos
        self.calls: list[int] = []
        """Batch size of every generate() call, so tests can check batching."""

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        self.calls.append(len(prompts))
        out = []
        for prompt, each in zip(prompts, request_params(prompts, params), strict=True):
            text = self.respond(self.tokenizer.decode(list(prompt), skip_special_tokens=False))
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if self.end_with_eos and self.tokenizer.eos_token_id is not None:
                ids.append(int(self.tokenizer.eos_token_id))
            finish = "stop"
            if len(ids) > each.max_new_tokens:
                ids, finish = ids[: each.max_new_tokens], "length"
                text = self.tokenizer.decode(ids)
            out.append(Generation(ids, [0.0] * len(ids), text, finish))
        return out

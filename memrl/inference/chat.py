"""Chat encoding: messages through the tokenizer's chat template, to prompt token ids.

Every model call of every agent (and the LLM answerer of the memory reward) builds its prompt
here, so one conversation is always encoded the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def render_messages(
    tokenizer: Any, messages: Sequence[dict[str, str]], *, tools: list[dict] | None = None
) -> str:
    """The conversation as text through the chat template, ready for the assistant's reply."""
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=True, **kwargs
    )


def encode_messages(
    tokenizer: Any, messages: Sequence[dict[str, str]], *, tools: list[dict] | None = None
) -> list[int]:
    """Token ids of `render_messages`; the template already holds every special token.

    (transformers 5 returns a dict from `apply_chat_template(tokenize=True)`, so we render to
    text and encode it ourselves.)
    """
    text = render_messages(tokenizer, messages, tools=tools)
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_chat(tokenizer: Any, text: str) -> str:
    """`text` as one user message through the chat template, ready for the reply."""
    return render_messages(tokenizer, [{"role": "user", "content": text}])


def encode_chat(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` as one user message (`render_chat`)."""
    return encode_messages(tokenizer, [{"role": "user", "content": text}])

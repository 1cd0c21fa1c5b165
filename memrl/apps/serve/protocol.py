"""The OpenAI chat API as `memrl serve` speaks it: requests in, responses and errors out.

The message convention. A chat request is one question about some documents:

    the LAST user message          the question
    every message before it        a document each, in order (system, user or assistant
                                   alike: the agent reads them all as context)

so `[{"role": "user", "content": <document>}, {"role": "user", "content": <question>}]` is the
smallest request, and a conversation's earlier turns are read as context. Nothing may follow
the question. Content is a string or a list of text parts (`{"type": "text", ...}`).

The reply's message is the agent's final response (its answer, e.g. in `\\boxed{}`);
`usage` counts every token the model read and wrote over all turns (the memory updates and
the answer); a `memrl` object adds the extracted answer, the chunks read and the final
memory. Streaming (`stream: true`) sends, as server-sent events, one chunk per document
chunk read (an empty delta with `reasoning_content` "read chunk i of n ..." and a `progress`
object), then the answer as one content delta, then the finish reason (and `usage` when
`stream_options.include_usage`), then `[DONE]`.

Errors are one line of JSON, `{"error": {"message", "type", "param", "code"}}`, with the
HTTP status the OpenAI API uses: 400 (malformed), 401 (API key), 404 (unknown model),
408 (a head or body that did not arrive in time), 413 (too large), 429 (too many requests
or connections at once), 503 (cancelled by the server's shutdown). 499 (the client closed
its connection) is logged, never sent: nobody is there to read it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memrl.apps.ask.api import AskProgress, AskResult
from memrl.apps.ask.documents import check_text
from memrl.errors import MemrlInputError

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               404: "not_found_error", 408: "timeout_error", 413: "invalid_request_error",
               429: "rate_limit_error", 499: "client_closed_request", 500: "server_error",
               503: "service_unavailable"}


class ApiError(Exception):
    """A request the server refuses, with its HTTP status and one-line message."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param)


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": status}}


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ApiError(400, f"only text content is supported, got a {part.type!r} "
                               "part", "messages")
            parts.append(part.text)
        return "".join(parts)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of a chat completion request that the server reads; others are ignored
    (clients send many), except those that ask for what it cannot do (n > 1)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    """The answer's length (the final turn's max_new_tokens); the memory keeps its own."""
    max_completion_tokens: int | None = Field(None, ge=1)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)

    def agent_overrides(self) -> dict[str, Any]:
        """Agent settings this request asks for (over the server's)."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.top_p is not None:
            out["top_p"] = self.top_p
        answer_tokens = self.max_completion_tokens or self.max_tokens
        if answer_tokens is not None:
            out["max_final_tokens"] = answer_tokens
        if self.seed is not None:
            out["seed"] = self.seed
        return out


def parse_request(raw: bytes) -> ChatRequest:
    """A ChatRequest from a body, or an ApiError(400) saying in one line what is wrong."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ApiError(400, f"{where}: {err['msg']}", where or None) from None


def split_messages(messages: list[Message]) -> tuple[list[str], str]:
    """(documents, question) by the convention of the module docstring."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        raise ApiError(400, "no user message: the last user message is the question",
                       "messages")
    last = users[-1]
    if last != len(messages) - 1:
        raise ApiError(400, "the question (a user message) must be the last message",
                       "messages")
    question = messages[last].text()
    if not question.strip():
        raise ApiError(400, "the question (the last user message) is empty", "messages")
    try:
        check_text(question, f"message {last + 1} (the question)")
    except MemrlInputError as exc:
        raise ApiError(400, str(exc), "messages") from None
    documents = [m.text() for m in messages[:last]]
    if not documents:
        raise ApiError(400, "no document: send the documents as the messages before the "
                       "question", "messages")
    return documents, question


class Completion:
    """The ids and names one response's bodies share."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def body(self, result: AskResult) -> dict[str, Any]:
        """The whole `chat.completion` object."""
        return {
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.response},
                         "logprobs": None, "finish_reason": finish_reason(result)}],
            "usage": usage_body(result),
            "memrl": memrl_body(result),
        }

    def chunk(self, delta: dict[str, Any], finish: str | None = None,
              **extra: Any) -> dict[str, Any]:
        """One `chat.completion.chunk` with one choice."""
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}], **extra}

    def progress_chunk(self, event: AskProgress) -> dict[str, Any]:
        text = (f"read chunk {event.chunks_read} of {event.num_chunks} "
                f"({event.document_tokens_read:,} document tokens; memory "
                f"{event.memory_tokens} tokens)\n")
        return self.chunk({"reasoning_content": text}, progress={
            "chunks_read": event.chunks_read, "num_chunks": event.num_chunks,
            "document_tokens_read": event.document_tokens_read,
            "memory_tokens": event.memory_tokens,
            "total_tokens": event.usage.total_tokens})

    def usage_chunk(self, result: AskResult) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": usage_body(result),
                "memrl": memrl_body(result)}


def finish_reason(result: AskResult) -> str:
    return "length" if result.trajectory.turns[-1].truncated else "stop"


def usage_body(result: AskResult) -> dict[str, int]:
    return {"prompt_tokens": result.usage.prompt_tokens,
            "completion_tokens": result.usage.completion_tokens,
            "total_tokens": result.usage.total_tokens}


def memrl_body(result: AskResult) -> dict[str, Any]:
    return {"answer": result.answer, "num_chunks": result.num_chunks,
            "document_tokens": result.context_tokens, "memory": result.memories[-1]
            if result.memories else "", "elapsed_s": round(result.elapsed_s, 3)}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False,
                                                        separators=(",", ":"))
    return f"data: {text}\n\n".encode()

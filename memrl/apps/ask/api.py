"""Ask a memory agent about your own documents: one function, `ask` (and `aask`, its coroutine).

    from memrl.apps.ask import ask
    result = ask("runs/quickstart/model_rl", [Path("report.pdf")], "Who founded the lab?")
    result.text          # the answer (or the whole final reply when it holds no answer)
    result.memories      # the memory after each chunk
    result.usage         # every token the model read and wrote

The documents are streamed into chunks (`memrl.apps.ask.chunking.DocumentChunks`) and read by
`memrl.agents.MemAgent.aread`, one chunk at a time, with a memory of bounded size: the cost
grows linearly with the documents and the memory used does not grow at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.agents.memagent import MemAgent, MemAgentConfig, ProgressEvent
from memrl.trajectory import Trajectory
from memrl.apps.ask.chunking import DocumentChunks
from memrl.apps.ask.documents import Document, check_text, open_document
from memrl.apps.ask.settings import agent_config, stored_settings
from memrl.errors import MemrlInputError
from memrl.rewards.memagent import extract_answer_is
from memrl.rewards.qa import extract_boxed

DocumentSource = str | os.PathLike
"""A document: a path (`os.PathLike`: a file read by its suffix) or a `str` (the text)."""


@dataclass(frozen=True)
class Usage:
    """Tokens the model processed, over every turn (each memory update and the answer)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class AskProgress:
    """Where a reading stands, after each chunk and after the answer."""

    chunks_read: int
    num_chunks: int
    document_tokens_read: int
    """Tokens of the documents read so far (of `DocumentChunks.context_tokens`, or fewer
    when max_chunks drops some)."""
    usage: Usage
    """Tokens processed so far."""
    memory: str
    """The memory after the last chunk read."""
    memory_tokens: int
    elapsed_s: float
    done: bool = False
    """True for the last event: the answer is there."""


ProgressFn = Callable[[AskProgress], None]


@dataclass
class AskResult:
    """The answer, and how the agent got there."""

    question: str
    answer: str | None
    """The answer extracted from the final reply (its last `\\boxed{}`, else the text after
    "the answer is"); None when the reply holds neither."""
    response: str
    """The final reply, whole."""
    memories: list[str]
    """The memory after each chunk."""
    trajectory: Trajectory
    """The episode's turns (their token counts; ids are not kept)."""
    documents: list[str]
    num_chunks: int
    context_tokens: int
    """Tokens of the documents, whole."""
    capped: bool
    """Whether max_chunks cut the documents (then fewer tokens were read)."""
    document_tokens_read: int
    """Tokens of the documents read: context_tokens, or fewer when capped."""
    usage: Usage
    elapsed_s: float
    config: MemAgentConfig
    model: str = ""

    @property
    def text(self) -> str:
        """What to show as the answer: `answer`, or the whole reply when it has none."""
        return self.answer if self.answer is not None else self.response.strip()

    def trace_row(self) -> dict[str, Any]:
        """The episode as one line of a trajectories file, the format `memrl view` renders
        (with no gold answer and no score), plus what was read and the token usage."""
        updates = [t for t in self.trajectory.turns if t.kind == "memory_update"]
        final = self.trajectory.turns[-1]
        return {
            "id": ", ".join(self.documents)[:120],
            "sample_index": 0,
            "num_docs": len(self.documents),
            "question": self.question,
            "answers": [],
            "documents": self.documents,
            "model": self.model,
            "memories": self.memories,
            "memory_tokens": [t.response_tokens for t in updates],
            "memory_truncated": [t.truncated for t in updates],
            "final_response": self.response,
            "final_truncated": final.truncated,
            "answer": self.answer,
            "scores": {},
            "num_chunks": self.num_chunks,
            "context_tokens": self.context_tokens,
            "capped": self.capped,
            "document_tokens_read": self.document_tokens_read,
            "usage": {"prompt_tokens": self.usage.prompt_tokens,
                      "completion_tokens": self.usage.completion_tokens,
                      "total_tokens": self.usage.total_tokens},
            "elapsed_s": round(self.elapsed_s, 3),
            "config": self.config.model_dump(mode="json"),
        }


def ask(
    model: str | os.PathLike | Any,
    documents: DocumentSource | Sequence[DocumentSource],
    question: str,
    *,
    config: MemAgentConfig | Mapping[str, Any] | None = None,
    progress: ProgressFn | None = None,
    device: str | None = None,
    dtype: str | None = None,
    max_document_tokens: int | None = None,
) -> AskResult:
    """Read `documents` with a memory agent and answer `question` about them.

    `model`: a model directory (loaded in this process with transformers, on `device` in
    `dtype`) or an engine (`HFEngine`, `VLLMEngine`, `OpenAIEngine`, ...).
    `documents`: paths (`os.PathLike`, read by suffix: text, Markdown, HTML, PDF) or strings
    (the text itself), any length. `config`: the agent's settings (a MemAgentConfig as it
    is), or overrides of the settings stored with the model (`memrl.apps.ask.settings`).
    `progress` is called after each chunk and after the answer. Input errors (a missing or
    empty document, an empty question, ...) are MemrlInputErrors, raised before a model
    given by path is loaded.
    """
    if isinstance(model, str | os.PathLike):
        from memrl.inference.hf import HFEngine
        from memrl.inference.loader import load_model, load_tokenizer

        docs = open_documents(documents)
        question = check_question(question)
        cfg = resolve_config(config, model)
        tokenizer = load_tokenizer(model)
        chunks = document_chunks(tokenizer, docs, cfg, max_document_tokens)
        generator = HFEngine(load_model(model, device=device, dtype=dtype), tokenizer)
        generator.name_or_path = str(model)
        return asyncio.run(read(generator, chunks, question, cfg, progress=progress))
    return asyncio.run(aask(model, documents, question, config=config, progress=progress,
                            max_document_tokens=max_document_tokens))


async def aask(
    engine: Any,
    documents: DocumentSource | Sequence[DocumentSource],
    question: str,
    *,
    config: MemAgentConfig | Mapping[str, Any] | None = None,
    progress: ProgressFn | None = None,
    max_document_tokens: int | None = None,
) -> AskResult:
    """`ask` as a coroutine, on an engine: concurrent calls share the engine, which batches
    their requests (`memrl serve` answers every request this way). The documents are
    counted in a worker thread."""
    docs = open_documents(documents)
    question = check_question(question)
    cfg = resolve_config(config, getattr(engine, "name_or_path", None))
    chunks = await asyncio.to_thread(document_chunks, engine.tokenizer, docs, cfg,
                                     max_document_tokens)
    return await read(engine, chunks, question, cfg, progress=progress)


# ---- the steps, for the command line and the server ------------------------------------


def open_documents(documents: DocumentSource | Sequence[DocumentSource]) -> list[Document]:
    """Checked `Document`s (`memrl.apps.ask.documents.open_document`); at least one."""
    if isinstance(documents, str | os.PathLike):
        documents = [documents]
    docs = [open_document(d, i) for i, d in enumerate(documents, start=1)]
    if not docs:
        raise MemrlInputError("no document given")
    return docs


def check_question(question: str, location: str = "question") -> str:
    """The question, stripped: not empty, valid Unicode (else a one-line MemrlInputError
    at `location`)."""
    if not isinstance(question, str) or not question.strip():
        raise MemrlInputError("empty question", location=location)
    return check_text(question.strip(), location)


def resolve_config(
    config: MemAgentConfig | Mapping[str, Any] | None, model: str | os.PathLike | None
) -> MemAgentConfig:
    """A MemAgentConfig as given, or the settings stored with `model` (a directory) with
    the overrides of a mapping applied."""
    if isinstance(config, MemAgentConfig):
        return config
    model_dir = Path(model) if model is not None and Path(model).is_dir() else None
    return agent_config(stored_settings(model_dir), dict(config or {}))


def document_chunks(
    tokenizer: Any, documents: Sequence[Document], config: MemAgentConfig,
    max_document_tokens: int | None = None,
) -> DocumentChunks:
    """The documents as the agent will read them (counted once here)."""
    return DocumentChunks(tokenizer, documents, config.chunk_size, config.max_chunks,
                          config.truncation, max_tokens=max_document_tokens)


def extract_answer(response: str) -> str | None:
    """The last `\\boxed{}` of the reply, else the text after "the answer is", else None."""
    boxed = extract_boxed(response)
    return boxed if boxed is not None else extract_answer_is(response)


async def read(
    generator: Any,
    chunks: DocumentChunks,
    question: str,
    config: MemAgentConfig,
    *,
    progress: ProgressFn | None = None,
    episode_id: str = "document",
) -> AskResult:
    """Run MemAgent over `chunks` and collect the result (`progress` after each turn)."""
    agent = MemAgent(generator, config)
    start = time.perf_counter()
    kept = sum(end - begin for begin, end in chunks.keep)
    state: dict[str, Any] = {"chunks": 0, "prompt": 0, "completion": 0,
                             "memory": agent.prompts.no_memory, "memory_tokens": 0}

    def on_event(event: ProgressEvent) -> None:
        turn = event.turn
        if turn is None:
            return
        state["prompt"] += turn.prompt_tokens
        state["completion"] += turn.response_tokens
        if event.kind == "chunks":
            state["chunks"] += 1
            state["memory"], state["memory_tokens"] = (turn.response_text,
                                                       turn.response_tokens)
        if progress is not None:
            progress(AskProgress(
                state["chunks"], chunks.num_chunks, min(state["chunks"] * chunks.chunk_size, kept),
                Usage(state["prompt"], state["completion"]), state["memory"],
                state["memory_tokens"], time.perf_counter() - start,
                done=event.kind == "final",
            ))

    trajectory = await agent.aread(question, chunks, episode_id=episode_id, progress=on_event)
    response = trajectory.details.final_response
    trajectory = dataclasses.replace(trajectory, answer=extract_answer(response))
    turns = trajectory.turns
    return AskResult(
        question=question,
        answer=trajectory.answer,
        response=response,
        memories=list(trajectory.details.memories),
        trajectory=trajectory,
        documents=[d.name for d in chunks.documents],
        num_chunks=trajectory.details.num_chunks,
        context_tokens=chunks.context_tokens,
        capped=chunks.capped,
        document_tokens_read=kept,
        usage=Usage(sum(t.prompt_tokens for t in turns),
                    sum(t.response_tokens for t in turns)),
        elapsed_s=time.perf_counter() - start,
        config=config,
        model=str(getattr(generator, "name_or_path", "")),
    )

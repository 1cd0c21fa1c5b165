"""MemAgent: read a long context chunk by chunk, overwrite a bounded memory, answer from it.

One episode (one record, one sample) is:

    memory = "No previous memory"
    for chunk in chunks(context):                 # chunk_size tokens each
        memory = model(update_prompt(question, memory, chunk))      # overwrite
    response = model(final_prompt(question, memory))
    answer = last \\boxed{...} in response

Every model call is one independent conversation (a single user message through the chat
template) and becomes one Turn. The episode is written once, as a coroutine
(`MemAgent._read_episode`), and `memrl.inference.schedule` runs many of them:

- lockstep (`run(mode="lockstep")`, the HF engine's): memory updates are stage 0 and final
  answers stage 1, so update k of every episode that still has a k-th chunk goes to the
  generator in ONE `generate` call, and the final turns of all episodes go in one last call
  once every episode has read all its chunks (as MemAgent does; the final turn has its own
  `max_new_tokens`). So a batch whose longest context has K chunks makes K + 1 calls.
- async (`run(mode="async")`, `arun`; `auto` picks it on vLLM and the server pool): each
  episode sends its next turn with `agenerate` as soon as its previous reply is back; the
  engine batches whatever is in flight.

`aread(question, chunks)` runs one episode over any `ChunkSource`: chunk texts that may be
produced while the episode runs (`memrl.apps.ask` streams a document of any length into it, so
its token ids are never all in memory).

Turn t of the episode of (record id, occurrence, sample index) is seeded with
`derive_seed(seed, record id, occurrence, sample index, t)` (memory update k is turn k, the
final answer turn num_chunks) on both schedules, so on an engine that seeds each request on
its own (vLLM, the server pool) they give the same trajectories; the HF engine seeds a whole
`generate` call (`memrl.inference.base`).

The agent does not score, nor extract the answer: its task reads the final response
(`MemAgentDetails.final_response`, the trajectory's `details`) and returns a copy with the
answer and the reward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memrl.agents.prompts import MemAgentPrompts, resolve_prompts
from memrl.data.records import QARecord
from memrl.inference.base import (
    SEED_MAX,
    Generation,
    Generator,
    RolloutMode,
    Sampler,
    episode_keys,
)
from memrl.inference.chat import encode_chat
from memrl.inference.schedule import (
    Episode,
    ModelCalls,
    ProgressEvent,
    arun_episodes,
    run_episodes,
)
from memrl.trajectory import Trajectory, Turn, generated_turn


class MemAgentConfig(BaseModel):
    """How the agent chunks, how long its memory and answer may be, and how it samples.

    Defaults follow MemAgent's published RULER-HQA evaluation: 5000-token chunks, 1024 new
    tokens per call (memory and final answer alike), temperature 0.7, top-p 0.95.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    chunk_size: int = Field(5000, ge=1)
    """Context tokens per chunk."""
    max_chunks: int | None = Field(None, ge=1)
    """Read at most this many chunks; None reads the whole context. Which part of a longer
    context is kept is `truncation`'s choice."""
    truncation: Literal["right", "center"] = "right"
    """How `max_chunks` shortens a context of more than max_chunks · chunk_size tokens
    (verl `data.truncation`): "right" keeps the first max_chunks chunks; "center" keeps the
    first and the last (max_chunks · chunk_size) // 2 tokens and drops the middle, then
    chunks what is left (MemAgent's training: `MemoryDataset` with `truncation='center'`)."""
    max_memory_tokens: int = Field(1024, ge=1)
    """New tokens allowed per memory update: this is what bounds the memory."""
    max_final_tokens: int = Field(1024, ge=1)
    """New tokens allowed for the final answer."""
    temperature: float = Field(0.7, ge=0, allow_inf_nan=False)
    """Sampling temperature (0 = greedy decoding)."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus sampling threshold."""
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    """Base sampling seed; turn t of the episode (record id, occurrence, sample index) is
    seeded with `derive_seed(seed, record id, occurrence, sample index, t)`, whichever
    schedule runs it, so runs are reproducible and no two requests share a seed."""
    prompts: str | MemAgentPrompts = "memagent"
    """A preset name (memagent, memagent-published, memagent-answer-is: see
    memrl.agents.prompts.PROMPT_PRESETS) or custom templates."""
    oracle_corrections: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    """Warm start only (the oracle of `memrl sft`; ignored by the agent itself): the share of
    the oracle's episodes in which it first writes a wrong sentence into memory — the
    context's sentence outside the needed facts sharing most words with the question, at the
    chunk that completes it — and corrects it at the next turn. The wrong turn is left out of
    the trajectory; the correcting one (a memory holding the wrong sentence, answered with
    the right memory) is trained. The oracle alone never shows a wrong memory, so a model
    imitating it never learns to drop one (docs/lab/results.md, SmolLM2)."""

    @field_validator("prompts")
    @classmethod
    def _known_prompts(cls, prompts: str | MemAgentPrompts) -> str | MemAgentPrompts:
        resolve_prompts(prompts)  # raises on an unknown preset name
        return prompts

    @property
    def resolved_prompts(self) -> MemAgentPrompts:
        return resolve_prompts(self.prompts)


@dataclass(frozen=True)
class ContextChunks:
    """A context cut into consecutive token chunks, kept as the decoded chunk texts.

    Only the texts are kept (token ids of a million-token context would take ~36 MB as
    Python ints, per record); prompts are built from the texts anyway.
    """

    texts: list[str]
    token_counts: list[int]
    """Tokens in each chunk (chunk_size, except possibly the last)."""
    context_tokens: int
    """Tokens in the whole context, including any chunks dropped by max_chunks."""
    capped: bool
    """True when max_chunks dropped part of the context (its tail, or its middle)."""

    @property
    def num_chunks(self) -> int:
        return len(self.texts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.texts)


class ChunkSource(Protocol):
    """What an episode reads: its chunk texts in order (iterated once per episode), and
    what is known of them before the first is read. `ContextChunks` is one; `memrl.apps.ask`'s
    streamed documents are another (their chunks are cut while the episode runs)."""

    @property
    def num_chunks(self) -> int:
        """How many texts iterating gives."""
        ...

    @property
    def context_tokens(self) -> int:
        """Tokens in the whole context, including any chunks dropped by max_chunks."""
        ...

    @property
    def capped(self) -> bool:
        """True when max_chunks dropped part of the context."""
        ...

    def __iter__(self) -> Iterator[str]:
        ...


TRUNCATIONS = ("right", "center")


def center_truncate(ids: Sequence[int], max_length: int) -> list[int]:
    """verl's `postprocess_data(truncation="center")` (verl/utils/torch_functional.py): a
    sequence longer than `max_length` keeps its first and its last `max_length // 2` tokens
    (so an odd max_length keeps max_length - 1); a shorter one is kept whole. (At
    max_length 1 verl's `ids[-0:]` would keep everything; here the tail is then empty.)"""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    if len(ids) <= max_length:
        return list(ids)
    half = max_length // 2
    return list(ids[:half]) + list(ids[len(ids) - half:])


def split_token_ids(
    ids: Sequence[int], chunk_size: int, max_chunks: int | None = None,
    truncation: str = "right",
) -> tuple[list[list[int]], bool]:
    """Consecutive `chunk_size` pieces of `ids` (the last may be shorter), at most
    `max_chunks` of them; also whether max_chunks dropped any tokens.

    truncation "right": the first max_chunks pieces. "center": the pieces of
    `center_truncate(ids, max_chunks * chunk_size)`, so one piece may straddle the cut, as in
    MemAgent (which slices the centre-truncated token tensor into chunks).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {', '.join(TRUNCATIONS)}, got {truncation!r}")
    if truncation == "center" and max_chunks is not None:
        kept = center_truncate(ids, max_chunks * chunk_size)
        pieces, _ = split_token_ids(kept, chunk_size)
        return pieces, len(kept) < len(ids)
    num = -(-len(ids) // chunk_size)
    capped = max_chunks is not None and num > max_chunks
    if capped:
        num = max_chunks
    return [list(ids[i * chunk_size : (i + 1) * chunk_size]) for i in range(num)], capped


def chunk_context(
    tokenizer: Any, text: str, chunk_size: int, max_chunks: int | None = None,
    truncation: str = "right",
) -> ContextChunks:
    """Tokenize `text` without special tokens, split it with `split_token_ids`, and decode
    each chunk back to text, as MemAgent does (a chunk boundary inside a multi-byte character
    decodes to U+FFFD there too).
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, capped = split_token_ids(ids, chunk_size, max_chunks, truncation)
    texts = [tokenizer.decode(piece, skip_special_tokens=False) for piece in pieces]
    return ContextChunks(texts, [len(piece) for piece in pieces], len(ids), capped)


ProgressCallback = Callable[[ProgressEvent], None]


def rich_progress_callback(progress: Any, description: str = "") -> ProgressCallback:
    """Drive two bars of a `rich.progress.Progress`: episodes and chunks.

    Totals grow with every "start" event, so one callback can serve several runs.
    """
    prefix = f"{description} " if description else ""
    episodes = progress.add_task(f"{prefix}episodes", total=0)
    chunks = progress.add_task(f"{prefix}chunks", total=0)

    def on_event(event: ProgressEvent) -> None:
        if event.kind == "start":
            for task, extra in ((episodes, event.episodes), (chunks, event.chunks)):
                total = progress.tasks[_task_index(progress, task)].total or 0
                progress.update(task, total=total + extra)
        elif event.kind == "chunks":
            progress.advance(chunks, event.chunks)
        elif event.kind == "final":
            progress.advance(episodes, event.episodes)

    return on_event


def _task_index(progress: Any, task_id: Any) -> int:
    return next(i for i, t in enumerate(progress.tasks) if t.id == task_id)


@dataclass(frozen=True)
class MemAgentTurn:
    """What MemAgent knows of one turn (`Turn.detail`)."""

    chunk_index: int | None
    """The chunk a memory update read; None for the final answer."""


@dataclass(frozen=True)
class MemAgentDetails:
    """What MemAgent keeps of an episode (`Trajectory.details`)."""

    memories: tuple[str, ...]
    """The memory after each chunk."""
    num_chunks: int
    context_tokens: int
    """Tokens in the whole context, including any chunks dropped by max_chunks."""
    capped: bool
    """True when max_chunks dropped part of the context."""
    final_response: str
    """The final reply as text (its task extracts the answer from it)."""


FINAL_STAGE = 1
"""The lockstep stage of the final answers (memory updates are stage 0): all of a run's
final answers go in one last call (`memrl.inference.schedule`)."""


@dataclass(frozen=True)
class _Episode:
    record_id: str
    question: str
    sample_index: int
    key: tuple[str, int, int]
    """(record id, occurrence, sample index): what seeds its requests (`episode_keys`)."""
    chunks: ChunkSource


def _ignore(event: ProgressEvent) -> None:
    """The progress callback of a run that asked for none."""


class MemAgent:
    """The recurrent memory agent: one episode, written once (`_read_episode`), run over
    many records in lockstep or as concurrent coroutines (`memrl.inference.schedule`)."""

    def __init__(self, generator: Generator, config: MemAgentConfig | None = None, *,
                 sampler: Sampler | None = None) -> None:
        """`sampler`: how its requests sample and are seeded (a task's rollout gives it);
        default: the config's temperature, top_p and seed."""
        self.generator = generator
        self.config = config or MemAgentConfig()
        self.prompts = self.config.resolved_prompts
        self.sampler = sampler or Sampler(generator, temperature=self.config.temperature,
                                          top_p=self.config.top_p, seed=self.config.seed)

    @property
    def tokenizer(self) -> Any:
        return self.generator.tokenizer

    def chunk(self, record: QARecord) -> ContextChunks:
        """The chunks this agent reads for `record`."""
        cfg = self.config
        return chunk_context(
            self.tokenizer, record.render_context(), cfg.chunk_size, cfg.max_chunks,
            cfg.truncation,
        )

    def update_prompt_ids(self, question: str, memory: str, chunk: str) -> list[int]:
        return encode_chat(
            self.tokenizer, self.prompts.update_text(prompt=question, memory=memory, chunk=chunk)
        )

    def final_prompt_ids(self, question: str, memory: str) -> list[int]:
        return encode_chat(self.tokenizer, self.prompts.final_text(prompt=question, memory=memory))

    def run(
        self,
        records: Sequence[QARecord],
        num_samples: int = 1,
        progress: ProgressCallback | None = None,
        *,
        keep_token_ids: bool = True,
        mode: RolloutMode = "auto",
    ) -> list[Trajectory]:
        """One trajectory per (record, sample), ordered record by record, samples 0..n-1.

        `mode` picks the schedule (`memrl.inference.schedule`): `lockstep` (K + 1 batched
        `generate` calls), `async` (every episode a coroutine over `agenerate`), or `auto`
        (async on an engine with continuous batching, else lockstep). Both give the same
        trajectories on an engine that seeds each request on its own.
        `keep_token_ids=False` leaves the turns' prompt_ids / response_ids / logprobs empty
        (their lengths stay in `prompt_tokens` / `response_tokens`): evaluation over
        millions of context tokens does not need them, and keeping every prompt would take
        gigabytes. Training needs them.
        """
        return run_episodes(
            self.generator, self._episodes(records, num_samples, progress, keep_token_ids), mode
        )

    async def arun(
        self,
        records: Sequence[QARecord],
        num_samples: int = 1,
        progress: ProgressCallback | None = None,
        *,
        keep_token_ids: bool = True,
    ) -> list[Trajectory]:
        """`run` on the async schedule inside a running event loop."""
        return await arun_episodes(
            self.generator, self._episodes(records, num_samples, progress, keep_token_ids)
        )

    async def aread(
        self,
        question: str,
        chunks: ChunkSource,
        *,
        episode_id: str = "document",
        progress: ProgressCallback | None = None,
        keep_token_ids: bool = False,
    ) -> Trajectory:
        """One episode over `chunks` (any `ChunkSource`, e.g. a document streamed into
        chunks while it is read) on the async schedule: the memory updates, then the final
        answer, each turn sent with `agenerate` (the engine batches concurrent episodes).
        Turn t is seeded with `derive_seed(seed, episode_id, 0, 0, t)`, as `run` seeds a
        record of that id. Progress comes per turn, each event carrying its Turn."""
        report = progress or _ignore
        report(ProgressEvent("start", episodes=1, chunks=chunks.num_chunks))
        episode = _Episode(episode_id, question, 0, (episode_id, 0, 0), chunks)
        [trajectory] = await arun_episodes(
            self.generator, [partial(self._read_episode, episode=episode, report=report,
                                     keep_ids=keep_token_ids)]
        )
        return trajectory

    def _episodes(
        self, records: Sequence[QARecord], num_samples: int, progress: ProgressCallback | None,
        keep_ids: bool,
    ) -> list[Episode[Trajectory]]:
        """The run's episodes (record by record, samples 0..n-1), after the "start" event."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        report = progress or _ignore
        keys = iter(episode_keys([r.id for r in records], num_samples))
        episodes: list[_Episode] = []
        for record in records:
            chunks = self.chunk(record)
            episodes += [_Episode(record.id, record.question, s, next(keys), chunks)
                         for s in range(num_samples)]
        if episodes:
            report(ProgressEvent(
                "start", episodes=len(episodes), chunks=sum(e.chunks.num_chunks for e in episodes)
            ))
        return [partial(self._read_episode, episode=e, report=report, keep_ids=keep_ids)
                for e in episodes]

    async def _read_episode(self, calls: ModelCalls, *, episode: _Episode,
                           report: ProgressCallback, keep_ids: bool) -> Trajectory:
        """One episode, whichever schedule runs it: memory update k (turn k, stage 0) per
        chunk, then the final answer (turn num_chunks, stage 1); a progress event per turn."""
        cfg, question = self.config, episode.question
        memory, memories, turns = self.prompts.no_memory, [], []
        for k, chunk in enumerate(episode.chunks):
            prompt = self.update_prompt_ids(question, memory, chunk)
            gen = await calls.generate(
                prompt, self.sampler.params(cfg.max_memory_tokens, *episode.key, k))
            turns.append(_turn("memory_update", prompt, gen, k, keep_ids))
            # Overwrite. An empty response leaves an empty memory (as in MemAgent, which
            # only uses "No previous memory" before the first chunk).
            memory = self.sampler.text(gen)
            memories.append(memory)
            report(ProgressEvent("chunks", chunks=1, turn=turns[-1]))
        prompt = self.final_prompt_ids(question, memory)
        gen = await calls.generate(
            prompt, self.sampler.params(cfg.max_final_tokens, *episode.key, len(memories)),
            stage=FINAL_STAGE,
        )
        turns.append(_turn("final", prompt, gen, None, keep_ids))
        report(ProgressEvent("final", episodes=1, turn=turns[-1]))
        details = MemAgentDetails(
            memories=tuple(memories), num_chunks=len(memories),
            context_tokens=episode.chunks.context_tokens, capped=episode.chunks.capped,
            final_response=self.sampler.text(gen),
        )
        return Trajectory(record_id=episode.record_id, sample_index=episode.sample_index,
                          turns=tuple(turns), details=details)


def _turn(
    kind: str, prompt: list[int], gen: Generation, chunk_index: int | None, keep_ids: bool
) -> Turn:
    return generated_turn(kind, prompt, gen, keep_ids=keep_ids, detail=MemAgentTurn(chunk_index))

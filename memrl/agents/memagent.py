"""MemAgent: read a long context chunk by chunk, overwrite a bounded memory, answer from it.

One episode (one record, one sample) is:

    memory = "No previous memory"
    for chunk in chunks(context):                 # chunk_size tokens each
        memory = model(update_prompt(question, memory, chunk))      # overwrite
    response = model(final_prompt(question, memory))
    answer = last \\boxed{...} in response

Every model call is one independent conversation (a single user message through the chat
template) and becomes one Turn. Two schedules run the same episodes:

- lockstep (`run(mode="lockstep")`, the HF engine's): step k of every episode that still
  has a k-th chunk goes to the generator in ONE `generate` call, and the final turns of all
  episodes go in one last call once every episode has read all its chunks (as MemAgent
  does; the final turn has its own `max_new_tokens`). So a batch whose longest context has
  K chunks makes K + 1 generate calls.
- async (`arun`, or `run(mode="async")`; `auto` picks it on vLLM and the server pool): each
  episode is a coroutine that sends its next turn with `agenerate` as soon as its previous
  reply is back; the engine batches whatever is in flight.

`aread(question, chunks)` runs one such coroutine over any `ChunkSource`: chunk texts that
may be produced while the episode runs (`memrl.ask` streams a document of any length into
it, so its token ids are never all in memory), with the same per-turn code and seeds.

Turn t of the episode of (record id, occurrence, sample index) is seeded with
`derive_seed(seed, record id, occurrence, sample index, t)` (memory update k is turn k, the
final answer turn num_chunks) on both schedules, so on an engine that seeds each request on
its own (vLLM, the server pool) they give the same trajectories; the HF engine seeds a whole
`generate` call (`memrl.inference.base`).

The agent does not score, nor extract the answer: its task reads the final response
(`Trajectory.info["final_response"]`) and sets `Trajectory.answer` and the reward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memrl.agents.prompts import MemAgentPrompts, resolve_prompts
from memrl.agents.trajectory import Trajectory, Turn
from memrl.data.records import QARecord
from memrl.inference.base import (
    SEED_MAX,
    Generation,
    Generator,
    RolloutMode,
    Sampler,
    SamplingParams,
    episode_keys,
    run_concurrently,
    runs_async,
)
from memrl.inference.chat import encode_chat


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
    what is known of them before the first is read. `ContextChunks` is one; `memrl.ask`'s
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


@dataclass(frozen=True)
class ProgressEvent:
    """What the agent reports while it runs, for progress bars.

    kind "start": `episodes` and `chunks` are the totals this run will process.
    kind "chunks": `chunks` memory updates just finished (one lockstep step, or one turn).
    kind "final": `episodes` episodes just finished (the final call, or one episode).
    On the async schedule every event but "start" is one turn, given as `turn` (its text,
    its token counts in `turn.meta`); the lockstep schedule's events carry none.
    """

    kind: Literal["start", "chunks", "final"]
    episodes: int = 0
    chunks: int = 0
    turn: Turn | None = None


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


@dataclass
class _Episode:
    record_id: str
    question: str
    sample_index: int
    key: tuple[str, int, int]
    """(record id, occurrence, sample index): what seeds its requests (`episode_keys`)."""
    chunks: ChunkSource
    memory: str
    memories: list[str] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)


class MemAgent:
    """The recurrent memory agent, run over many episodes in lockstep or as coroutines."""

    def __init__(self, generator: Generator, config: MemAgentConfig | None = None) -> None:
        self.generator = generator
        self.config = config or MemAgentConfig()
        self.prompts = self.config.resolved_prompts

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

        `mode` picks the schedule (`memrl.inference.base.RolloutMode`): `lockstep` (K + 1
        `generate` calls), `async` (`arun`: every episode a coroutine over `agenerate`), or
        `auto` (async on an engine with continuous batching, else lockstep). Both give the
        same trajectories on an engine that seeds each request on its own.
        `keep_token_ids=False` leaves the turns' prompt_ids / response_ids / logprobs empty
        (their lengths stay in `turn.meta`): evaluation over millions of context tokens does
        not need them, and keeping every prompt would take gigabytes. Training needs them.
        """
        if runs_async(self.generator, mode):
            return asyncio.run(
                self.arun(records, num_samples, progress, keep_token_ids=keep_token_ids)
            )
        episodes, sample, report = self._start(records, num_samples, progress)
        if not episodes:
            return []
        # Memory updates: step k of every episode that has a k-th chunk, in one call.
        num_steps = max(e.chunks.num_chunks for e in episodes)
        texts = {id(e): iter(e.chunks) for e in episodes}
        for k in range(num_steps):
            active = [e for e in episodes if k < e.chunks.num_chunks]
            prompts = [self._update_prompt(e, next(texts[id(e)])) for e in active]
            generations = sample(prompts, [self._update_params(sample, e, k) for e in active])
            for episode, prompt, gen in zip(active, prompts, generations, strict=True):
                self._read_chunk(episode, k, prompt, gen, sample, keep_token_ids)
            report(ProgressEvent("chunks", chunks=len(active)))

        # Final answers for every episode, in one call.
        prompts = [self._final_prompt(e) for e in episodes]
        generations = sample(prompts, [self._final_params(sample, e) for e in episodes])
        trajectories = [
            self._answer(episode, prompt, gen, sample, keep_token_ids)
            for episode, prompt, gen in zip(episodes, prompts, generations, strict=True)
        ]
        report(ProgressEvent("final", episodes=len(episodes)))
        return trajectories

    async def arun(
        self,
        records: Sequence[QARecord],
        num_samples: int = 1,
        progress: ProgressCallback | None = None,
        *,
        keep_token_ids: bool = True,
    ) -> list[Trajectory]:
        """`run` with every episode an independent coroutine: its next turn is sent with
        `agenerate` as soon as its own previous reply is back, so the engine batches
        continuously and nobody waits for the slowest reply of a step. Progress comes per
        turn ("chunks" of 1, "final" of 1). Same order and trajectories as the lockstep
        `run` on an engine that seeds each request on its own (vLLM, the server pool)."""
        episodes, sample, report = self._start(records, num_samples, progress)
        return await run_concurrently(
            self._episode_run(e, sample, report, keep_token_ids) for e in episodes
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
        chunks while it is read): the memory updates, then the final answer, each turn sent
        with `agenerate` (the engine batches concurrent episodes). Turn t is seeded with
        `derive_seed(seed, episode_id, 0, 0, t)`, as `arun` seeds a record of that id.
        Progress comes per turn, each event carrying its Turn."""
        sample = self._sampler()
        report = progress or (lambda event: None)
        episode = _Episode(episode_id, question, 0, (episode_id, 0, 0), chunks,
                           self.prompts.no_memory)
        report(ProgressEvent("start", episodes=1, chunks=chunks.num_chunks))
        return await self._episode_run(episode, sample, report, keep_token_ids)

    # ---- the steps both schedules share ------------------------------------------------

    async def _episode_run(self, episode: _Episode, sample: Sampler, report: ProgressCallback,
                           keep_ids: bool) -> Trajectory:
        """One episode on the async schedule."""
        for k, chunk in enumerate(episode.chunks):
            prompt = self._update_prompt(episode, chunk)
            gen = await sample.agenerate(prompt, self._update_params(sample, episode, k))
            self._read_chunk(episode, k, prompt, gen, sample, keep_ids)
            report(ProgressEvent("chunks", chunks=1, turn=episode.turns[-1]))
        prompt = self._final_prompt(episode)
        gen = await sample.agenerate(prompt, self._final_params(sample, episode))
        trajectory = self._answer(episode, prompt, gen, sample, keep_ids)
        report(ProgressEvent("final", episodes=1, turn=episode.turns[-1]))
        return trajectory

    def _sampler(self) -> Sampler:
        return Sampler(
            self.generator,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            seed=self.config.seed,
        )

    def _start(
        self, records: Sequence[QARecord], num_samples: int, progress: ProgressCallback | None
    ) -> tuple[list[_Episode], Sampler, ProgressCallback]:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        report = progress or (lambda event: None)
        sample = self._sampler()
        keys = iter(episode_keys([r.id for r in records], num_samples))
        episodes: list[_Episode] = []
        for record in records:
            chunks = self.chunk(record)
            for s in range(num_samples):
                episodes.append(_Episode(record.id, record.question, s, next(keys), chunks,
                                         self.prompts.no_memory))
        if episodes:
            report(ProgressEvent(
                "start", episodes=len(episodes), chunks=sum(e.chunks.num_chunks for e in episodes)
            ))
        return episodes, sample, report

    def _update_prompt(self, episode: _Episode, chunk: str) -> list[int]:
        return self.update_prompt_ids(episode.question, episode.memory, chunk)

    def _final_prompt(self, episode: _Episode) -> list[int]:
        return self.final_prompt_ids(episode.question, episode.memory)

    def _update_params(self, sample: Sampler, episode: _Episode, k: int) -> SamplingParams:
        """Turn k (memory update k) of the episode: seeded by (episode key, k)."""
        return sample.params(self.config.max_memory_tokens, *episode.key, k)

    def _final_params(self, sample: Sampler, episode: _Episode) -> SamplingParams:
        """The final turn, turn num_chunks of the episode (= the chunks it has read)."""
        return sample.params(self.config.max_final_tokens, *episode.key,
                             len(episode.memories))

    def _read_chunk(self, episode: _Episode, k: int, prompt: list[int], gen: Generation,
                    sample: Sampler, keep_ids: bool) -> None:
        episode.turns.append(_turn("memory_update", prompt, gen, k, keep_ids))
        # Overwrite. An empty response leaves an empty memory (as in MemAgent, which only
        # uses "No previous memory" before the first chunk).
        episode.memory = sample.text(gen)
        episode.memories.append(episode.memory)

    def _answer(self, episode: _Episode, prompt: list[int], gen: Generation, sample: Sampler,
                keep_ids: bool) -> Trajectory:
        episode.turns.append(_turn("final", prompt, gen, None, keep_ids))
        return Trajectory(
            record_id=episode.record_id,
            sample_index=episode.sample_index,
            turns=episode.turns,
            info={
                "memories": episode.memories,
                "num_chunks": len(episode.memories),
                "context_tokens": episode.chunks.context_tokens,
                "capped": episode.chunks.capped,
                "final_response": sample.text(gen),
            },
        )


def _turn(
    kind: str, prompt: list[int], gen: Generation, chunk_index: int | None, keep_ids: bool
) -> Turn:
    return Turn(
        kind=kind,
        prompt_ids=prompt if keep_ids else [],
        response_ids=list(gen.token_ids) if keep_ids else [],
        response_logprobs=list(gen.logprobs) if keep_ids else [],
        response_text=gen.text,
        finish_reason=gen.finish_reason,
        meta={
            "chunk_index": chunk_index,
            "prompt_tokens": len(prompt),
            "response_tokens": len(gen.token_ids),
        },
    )

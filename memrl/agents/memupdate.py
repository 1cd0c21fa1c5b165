"""MemoryUpdate: read a conversation, keep a long-term memory up to date through tool calls.

One episode (one LoCoMo QA pair, one sample) is:

    trial = store.fork(episode.id, request_id)            # private copy of the base memory
    for piece in pieces(dialogue):                        # session_chunk_turns turns each
        messages = [system, user(piece + the memories most related to it)]
        for turn in 1..max_turns:
            reply = model(messages)                       # one Turn, trained
            calls = parse_tool_calls(reply)
            if reply has no tool call: break              # the agent is done with the piece
            run at most max_parallel_calls calls on `trial`
            messages += [assistant reply, one tool message per call]   # prompt tokens only

The question is never shown. Every assistant reply is one `Turn(kind="tool")` whose
prompt_ids are the whole conversation so far (system, dialogue, earlier replies and tool
responses), so each turn is an independent training sample carrying the trajectory's
advantage, and tool responses are prompt tokens, never response tokens.

The episode is written once, as a coroutine, and `memrl.inference.schedule` runs many of
them, as in MemAgent: lockstep (`run(mode="lockstep")`, the HF engine's: every request is
stage 0, so each round is ONE `generate` call holding the next reply of every unfinished
episode) or async (`run(mode="async")`; `auto` picks it on vLLM and the server pool: each
(episode, sample) sends its next reply with `agenerate` as soon as its tool calls have run).
Reply t of the episode (id, occurrence, sample index) is seeded with
`derive_seed(seed, id, occurrence, sample index, t)` on both, so an engine that seeds each
request on its own gives the same trajectories either way. The agent does not score; the reward
(`memrl.rewards.memory_delta`) compares QA over the trial memory with QA over the base, and
whoever scores releases the trial namespaces (`MemoryUpdateDetails.namespace`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memrl.data.locomo import DialogueTurn, EmbeddingIndex, MemoryEpisode
from memrl.inference.base import (
    SEED_MAX,
    Generation,
    Generator,
    RolloutMode,
    Sampler,
    episode_keys,
)
from memrl.inference.chat import encode_messages
from memrl.inference.schedule import ModelCalls, run_episodes
from memrl.memory.embedder import Embedder, HashingEmbedder, default_embedder
from memrl.memory.store import MemoryBackend
from memrl.memory.tools import (
    TOOLS,
    TOP_K_MAX,
    execute_tool_call,
    parse_tool_calls,
    tools_prompt,
    truncate,
)
from memrl.trajectory import Trajectory, Turn, generated_turn


class MemUpdateConfig(BaseModel):
    """How the tool agent reads and samples, and how its memory edits are rewarded."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    # ---- the tool loop
    max_turns: int = Field(4, ge=1)
    """Assistant replies per dialogue piece (the loop also ends when a reply calls no tool)."""
    max_parallel_calls: int = Field(4, ge=1)
    """Tool calls executed per reply; further calls are skipped and count as a format error."""
    max_tool_response_length: int = Field(2000, ge=1)
    """Characters of one tool response shown to the model (longer ones are cut)."""
    max_response_tokens: int = Field(512, ge=1)
    """New tokens per assistant reply."""
    session_chunk_turns: int | None = Field(None, ge=1)
    """Dialogue turns per piece, each piece a fresh conversation over the same memory;
    None shows the whole evidence dialogue at once."""
    memory_view_k: int = Field(10, ge=0)
    """Memories most similar to the piece shown with it (with ids, to update or delete);
    0 shows only the memory size, and the agent must search."""
    temperature: float = Field(0.7, ge=0, allow_inf_nan=False)
    """Sampling temperature (0 = greedy decoding)."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus sampling threshold."""
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    """Base sampling seed; reply t of the episode (id, occurrence, sample index) is seeded
    with `derive_seed(seed, id, occurrence, sample index, t)`, whichever schedule runs it."""
    embedder: Literal["minilm", "hashing"] = "minilm"
    """Memory embeddings: the packaged MiniLM (memrl[embed]) or feature hashing (tests)."""
    store: Literal["local", "ray"] = "local"
    """Where the memory namespaces live: in this process, or in one `MemoryStoreManager` Ray
    actor shared by every rank of the run (memrl[ray]; each rank under its own prefix)."""
    store_actor: str = Field("memrl-memory-store", min_length=1)
    """The Ray actor's name (store: ray): ranks of one run find the same actor by it."""
    # ---- the reward (memrl.rewards.memory_delta)
    answerer: Literal["retrieval", "llm"] = "retrieval"
    """retrieval: best token F1 / containment of the gold answer among the top-k memories;
    llm: the policy model answers from the top-k memories (greedy), token F1."""
    top_k: int = Field(5, ge=1, le=TOP_K_MAX)
    """Memories retrieved for the question when scoring."""
    answer_max_tokens: int = Field(32, ge=1)
    """New tokens of the llm answerer."""
    format_penalty: float = Field(0.1, ge=0)
    """Subtracted times the share of replies with a format error (garbage: exactly this)."""
    efficiency_budget: int = Field(100, ge=0)
    """Words the memory may grow by before gains are discounted."""
    efficiency_scale: float = Field(100.0, gt=0)
    """Gains are multiplied by exp(-(growth - budget) / scale) beyond the budget."""
    include_adversarial: bool = False
    """Train on category-5 (adversarial) episodes too; they score 0 (no QA signal), so
    only their format penalty reaches the reward."""
    recall_threshold: float = Field(0.5, gt=0, le=1)
    """Token F1 at which a retrieved memory counts as covering an evidence turn."""
    reward_form: Literal["delta", "compression"] = "delta"
    """delta: the memory-delta reward (QA over the final memory minus over the initial one,
    efficiency-scaled); compression: Mem-α's form, QA over the final memory +
    compression_beta · (1 − memory words / dialogue words); both minus the format penalty."""
    compression_beta: float = Field(0.05, ge=0, allow_inf_nan=False)
    """β of the compression term (reward_form: compression)."""


SYSTEM_PROMPT = (
    "You maintain the long-term memory of an assistant that talks with two people. You are "
    "shown part of their conversation and the stored memories most related to it. Keep the "
    "memory useful for answering questions about these people later:\n"
    "- insert facts worth remembering (events, plans, preferences, relationships), each as one "
    "self-contained sentence that names the person and gives absolute dates (resolve "
    "'yesterday' or 'last week' with the session date);\n"
    "- update a memory that the conversation changes or makes more precise;\n"
    "- delete a memory that is wrong or duplicated;\n"
    "- skip small talk.\n"
    "Use the memory tools; you may call several at once. When the memory is up to date, "
    "reply briefly without calling a tool."
)

_RUN_IDS = itertools.count()
"""Process-wide counter: request ids stay unique across agents sharing one store."""


def make_embedder(name: str) -> Embedder:
    """The embedder a config names: `minilm` (process-wide MiniLM) or `hashing`."""
    if name == "minilm":
        return default_embedder()
    if name == "hashing":
        return HashingEmbedder()
    raise ValueError(f"unknown embedder {name!r}; known: minilm, hashing")


def create_base_namespace(
    store: MemoryBackend, episode: MemoryEpisode, index: EmbeddingIndex | None = None
) -> str:
    """The episode's base namespace (`episode.id`) holding its initial memory, created if
    missing; vectors come from `index` (precomputed by `prepare locomo embed=true`) when given."""
    if store.exists(episode.id):
        return episode.id
    texts = [f.text for f in episode.initial_memory]
    sources = [f.source or "initial" for f in episode.initial_memory]
    embeddings = None
    if index is not None and texts:
        embeddings = index.lookup(texts, fallback=getattr(store, "embedder", None))
    store.create_namespace(episode.id, texts, sources=sources, embeddings=embeddings)
    return episode.id


def dialogue_pieces(
    turns: Sequence[DialogueTurn], chunk_turns: int | None
) -> list[list[DialogueTurn]]:
    """Consecutive pieces of `chunk_turns` turns (all turns when None); at least one piece."""
    turns = list(turns)
    if not turns:
        return [[]]
    if chunk_turns is None:
        return [turns]
    return [turns[i : i + chunk_turns] for i in range(0, len(turns), chunk_turns)]


def render_dialogue(turns: Sequence[DialogueTurn]) -> str:
    """Turns grouped under `Session N (date)` headers, one `[dia_id] speaker: text` line each."""
    if not turns:
        return "(no dialogue)"
    lines: list[str] = []
    session = None
    for t in turns:
        if t.session != session:
            session = t.session
            lines.append(f"Session {t.session} ({t.date})" if t.date else f"Session {t.session}")
        lines.append(f"[{t.dia_id}] {t.speaker}: {t.text}")
    return "\n".join(lines)


def render_memory_view(hits: Sequence[tuple[str, str]], total: int) -> str:
    """The memory part of the user message: its size and `[id] text` of the related hits."""
    head = f"The memory holds {total} entr{'y' if total == 1 else 'ies'}."
    if not hits:
        return head + (" Use memory_search to look them up." if total else "")
    lines = "\n".join(f"[{rid}] {text}" for rid, text in hits)
    more = " Use memory_search to find others." if total > len(hits) else ""
    return f"{head} The most related ones:\n{lines}\n{more}".rstrip()


def user_message(dialogue: str, piece: int, pieces: int, memory_view: str) -> str:
    part = f" (part {piece + 1} of {pieces})" if pieces > 1 else ""
    return f"Conversation{part}:\n{dialogue}\n\nMemory:\n{memory_view}"


@dataclass(frozen=True)
class ToolTurn:
    """What the tool agent knows of one reply (`Turn.detail`)."""

    piece: int
    """The dialogue piece the reply works on."""
    turn_in_piece: int
    calls: int
    """Tool calls run (at most max_parallel_calls)."""
    format_errors: tuple[str, ...]
    """The kinds of format error in the reply (`memrl.memory.tools.parse_tool_calls`)."""


@dataclass(frozen=True)
class MemoryUpdateDetails:
    """What the tool agent keeps of an episode (`Trajectory.details`)."""

    namespace: str
    """The trial namespace the episode edited (whoever scores releases it)."""
    base_namespace: str
    pieces: int
    turns: int
    ops: dict[str, int]
    """Calls per operation: insert, update, delete, search."""
    invalid_calls: int
    failed_calls: int
    format_errors: dict[str, int]
    """Format errors by kind, over the episode."""
    format_error_turns: int
    """Replies with at least one format error."""
    memory_before: dict[str, int]
    """count, tokens and chars of the memory before the episode."""
    memory_after: dict[str, int]
    calls: tuple[dict[str, Any], ...]
    """Every call made: turn, name, arguments, ok, result (cut to 200 characters)."""


@dataclass
class _Episode:
    episode: MemoryEpisode
    sample_index: int
    key: tuple[str, int, int]
    """(episode id, occurrence, sample index): what seeds its replies (`episode_keys`)."""
    namespace: str
    pieces: list[list[DialogueTurn]]
    piece: int = 0
    turns_in_piece: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)
    format_errors: Counter = field(default_factory=Counter)
    error_turns: int = 0
    failed_calls: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False


class MemoryUpdateAgent:
    """The tool-calling memory agent, run over many (episode, sample) pairs in lockstep or
    as coroutines."""

    def __init__(
        self, generator: Generator, store: MemoryBackend, config: MemUpdateConfig | None = None
    ) -> None:
        self.generator = generator
        self.store = store
        self.config = config or MemUpdateConfig()
        template = getattr(self.tokenizer, "chat_template", None) or ""
        # Qwen templates render `tools=` and wrap tool messages in <tool_response> tags
        # themselves; plain ChatML (the tiny test model) does neither, so we do it.
        self._template_tools = "tools" in template
        self._template_wraps = "tool_response" in template

    @property
    def tokenizer(self) -> Any:
        return self.generator.tokenizer

    def system_message(self) -> str:
        if self._template_tools:
            return SYSTEM_PROMPT
        return f"{SYSTEM_PROMPT}\n\n{tools_prompt()}"

    def encode(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of the conversation through the chat template, ready for the reply."""
        return encode_messages(
            self.tokenizer, messages, tools=TOOLS if self._template_tools else None
        )

    def run(
        self,
        episodes: Sequence[MemoryEpisode],
        num_samples: int = 1,
        *,
        seed: int | None = None,
        keep_token_ids: bool = True,
        mode: RolloutMode = "auto",
        sampler: Sampler | None = None,
    ) -> list[Trajectory]:
        """One trajectory per (episode, sample), episode by episode, samples 0..n-1.

        Each works in its own trial namespace forked from the episode's base namespace
        (which must exist: `create_base_namespace`); the caller releases the trials.
        `seed` (default: the config's) seeds reply t of the episode (id, occurrence, sample)
        with `derive_seed(seed, id, occurrence, sample, t)`; `sampler` (a task's rollout
        gives it) replaces the config's sampling and `seed` altogether.
        `mode`: `lockstep` (one `generate` call per round over the unfinished episodes),
        `async` (each episode a coroutine over `agenerate`; each trial has its own
        namespace, so the order of edits across trials is free), or `auto` (async on an
        engine with continuous batching). Both give the same trajectories on an engine that
        seeds each request on its own.
        `keep_token_ids=False` leaves the turns' token ids empty (evaluation needs none).
        """
        cfg = self.config
        sampler = sampler or Sampler(self.generator, temperature=cfg.temperature,
                                     top_p=cfg.top_p, seed=cfg.seed if seed is None else seed)
        states = self._start(episodes, num_samples)
        with self._trials(states):
            return run_episodes(self.generator, [
                partial(self._episode, st=st, sampler=sampler, keep_ids=keep_token_ids)
                for st in states
            ], mode)

    async def _episode(self, calls: ModelCalls, *, st: _Episode, sampler: Sampler,
                       keep_ids: bool) -> Trajectory:
        """One (episode, sample), whichever schedule runs it: reply t is stage 0, seeded by
        (episode key, t)."""
        before = self.store.stats(st.namespace)
        self._start_piece(st)
        while not st.done:
            prompt = self.encode(st.messages)
            params = sampler.params(self.config.max_response_tokens, *st.key, len(st.turns))
            self._step(st, prompt, await calls.generate(prompt, params), sampler, keep_ids)
        return self._trajectory(st, before)

    def _start(self, episodes: Sequence[MemoryEpisode], num_samples: int) -> list[_Episode]:
        """The run's (episode, sample) states, each in a fresh trial namespace."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        run_id = next(_RUN_IDS)
        keys = iter(episode_keys([e.id for e in episodes], num_samples))
        states: list[_Episode] = []
        with self._trials(states):
            for e_index, episode in enumerate(episodes):
                pieces = dialogue_pieces(episode.dialogue, self.config.session_chunk_turns)
                for s in range(num_samples):
                    ns = self.store.fork(episode.id, f"r{run_id}-e{e_index}-s{s}")
                    states.append(_Episode(episode, s, next(keys), ns, pieces))
        return states

    @contextmanager
    def _trials(self, states: list[_Episode]) -> Iterator[None]:
        """On any failure, release the trial namespaces (nobody else knows their names)."""
        try:
            yield
        except BaseException:
            for st in states:
                self.store.release(st.namespace, missing_ok=True)
            raise

    # ---- one piece, one reply -------------------------------------------------------------

    def _start_piece(self, st: _Episode) -> None:
        piece = st.pieces[st.piece]
        dialogue = render_dialogue(piece)
        total = self.store.stats(st.namespace)["count"]
        hits: list[tuple[str, str]] = []
        if self.config.memory_view_k and total:
            found = self.store.search(st.namespace, dialogue, self.config.memory_view_k)
            hits = [(r.id, r.text) for r, _ in found]
        view = render_memory_view(hits, total)
        st.messages = [
            {"role": "system", "content": self.system_message()},
            {"role": "user", "content": user_message(dialogue, st.piece, len(st.pieces), view)},
        ]
        st.turns_in_piece = 0

    def _step(self, st: _Episode, prompt: list[int], gen: Generation, sampler: Sampler,
              keep_ids: bool) -> None:
        cfg = self.config
        text = sampler.text(gen)
        parsed = parse_tool_calls(text)
        calls = parsed.calls[: cfg.max_parallel_calls]
        error_kinds = list(parsed.error_kinds)
        errors = list(parsed.errors)
        skipped = len(parsed.calls) - len(calls)
        if skipped:
            error_kinds.append("too_many_calls")
            errors.append(
                f"{len(parsed.calls)} tool calls in one reply; only the first "
                f"{cfg.max_parallel_calls} were run, {skipped} skipped"
            )
        st.format_errors.update(error_kinds)
        st.error_turns += bool(error_kinds)

        turn_index = len(st.turns)
        responses: list[str] = []
        for call in calls:
            result = execute_tool_call(
                self.store,
                st.namespace,
                call,
                step=turn_index,
                max_response_length=cfg.max_tool_response_length,
            )
            st.ops[result.op] += 1
            st.failed_calls += not result.ok
            st.calls.append(
                {"turn": turn_index, "name": call.name, "arguments": call.arguments,
                 "ok": result.ok, "result": truncate(result.content, 200)}
            )
            responses.append(result.content)
        responses += [
            truncate(f"Error: {message}", cfg.max_tool_response_length) for message in errors
        ]

        st.turns.append(
            generated_turn("tool", prompt, gen, keep_ids=keep_ids, detail=ToolTurn(
                st.piece, st.turns_in_piece, len(calls), tuple(error_kinds)))
        )
        st.turns_in_piece += 1

        # A reply with no tool call (valid or not) ends the piece: the agent is done with it.
        attempted = bool(parsed.calls) or bool(parsed.error_kinds)
        if attempted and st.turns_in_piece < cfg.max_turns:
            st.messages.append({"role": "assistant", "content": text})
            for content in responses:
                body = content if self._template_wraps else _wrap_tool_response(content)
                st.messages.append({"role": "tool", "content": body})
            return
        st.piece += 1
        if st.piece < len(st.pieces):
            self._start_piece(st)
        else:
            st.done = True

    def _trajectory(self, st: _Episode, before: dict[str, int]) -> Trajectory:
        after = self.store.stats(st.namespace)
        return Trajectory(
            record_id=st.episode.id,
            sample_index=st.sample_index,
            turns=tuple(st.turns),
            details=MemoryUpdateDetails(
                namespace=st.namespace,
                base_namespace=st.episode.id,
                pieces=len(st.pieces),
                turns=len(st.turns),
                ops={op: st.ops.get(op, 0) for op in ("insert", "update", "delete", "search")},
                invalid_calls=st.ops.get("invalid", 0),
                failed_calls=st.failed_calls,
                format_errors=dict(st.format_errors),
                format_error_turns=st.error_turns,
                memory_before={k: before[k] for k in ("count", "tokens", "chars")},
                memory_after={k: after[k] for k in ("count", "tokens", "chars")},
                calls=tuple(st.calls),
            ),
        )


def _wrap_tool_response(content: str) -> str:
    """What Qwen's template makes of a tool message (as `format_tool_response` writes it)."""
    return f"<tool_response>\n{content}\n</tool_response>"


def memory_texts(store: MemoryBackend, namespace: str) -> dict[str, str]:
    """id -> text of every memory of a namespace (for diffs and logs)."""
    return {r.id: r.text for r in store.list(namespace)}


def memory_diff(before: dict[str, str], after: dict[str, str], limit: int = 20) -> dict[str, Any]:
    """What changed between two id -> text maps: counts, and up to `limit` examples each."""
    added = [(k, v) for k, v in after.items() if k not in before]
    removed = [(k, v) for k, v in before.items() if k not in after]
    changed = [(k, before[k], v) for k, v in after.items() if k in before and before[k] != v]
    return {
        "added": len(added),
        "removed": len(removed),
        "changed": len(changed),
        "added_texts": [{"id": k, "text": v} for k, v in added[:limit]],
        "removed_texts": [{"id": k, "text": v} for k, v in removed[:limit]],
        "changed_texts": [{"id": k, "before": b, "after": a} for k, b, a in changed[:limit]],
    }


__all__ = [
    "SYSTEM_PROMPT",
    "MemUpdateConfig",
    "MemoryUpdateAgent",
    "MemoryUpdateDetails",
    "ToolTurn",
    "create_base_namespace",
    "dialogue_pieces",
    "make_embedder",
    "memory_diff",
    "memory_texts",
    "render_dialogue",
    "render_memory_view",
    "user_message",
]

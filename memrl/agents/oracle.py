"""Teacher trajectories for a warm start: a scripted oracle, and replays of logged episodes.

Both produce real MemAgent `Trajectory`s (prompt and response token ids through the very
prompts and chunking of `MemAgent`), so supervised fine-tuning trains exactly the
conversations the agent will hold.

The oracle (`OracleGenerator`) plays the model inside an ordinary `MemAgent.run`: it reads
each prompt, finds its record by the question, and answers

    memory update:  the facts the question needs that have appeared so far, in document
                    order ("No previous memory" until the first one appears)
    final answer:   \\boxed{first gold answer} ("Therefore, the answer is <first gold
                    answer>." where the prompts ask for that: `answer_format` answer_is)

State tracking (`memrl prepare where-now|who-has|counting|knowledge-update`): the memory
is the asked state as the text read so far sets it (`memrl.data.state_tracking.state_facts`:
for "Where is John?" John's latest move so far), so a later move overwrites an earlier one;
a where-before question keeps the facts as above.

Corrections (`MemAgentConfig.oracle_corrections`, a share of the episodes, chosen by a hash
of the record id): in a chosen episode the oracle also makes one mistake, at the chunk that
completes the record's hard distractor (`hard_distractor`: the sentence outside the needed
facts sharing most words with the question), answering that update with the right memory
plus the distractor; the next update sees the wrong memory and answers the right one. The
mistaken turn is dropped from the episode's trajectory (`OracleGenerator.without_mistakes`),
so what is trained is the recovery, never the mistake.

The facts a question needs are the record's `facts` (memrl's RULER-HQA files carry them), else
the first sentences of its supporting documents (`Document.is_supporting`); the synthetic
data (`memrl.data.synthetic`) puts the one fact of each gold paragraph there. A fact counts
as seen once its whole sentence lies in the text read so far (a fact cut by a chunk boundary
enters with the chunk that completes it).

A replay (`replay_memagent`) rebuilds the turns of a `memrl eval` trajectories file line:
those files hold texts (memories after each chunk, the final response), not token ids, so
each turn's prompt is rebuilt from the record (data file) and the logged memory before it,
and its response is the logged text, encoded, plus the end-of-turn token.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Sequence
from typing import Any

from memrl.agents.memagent import MemAgent, MemAgentConfig, MemAgentDetails, MemAgentTurn
from memrl.agents.prompts import MemAgentPrompts
from memrl.data.records import QARecord, supporting_facts
from memrl.data.state_tracking.solver import state_facts
from memrl.errors import MemrlInputError
from memrl.inference.base import Generation, SamplingParams, request_params
from memrl.trajectory import Trajectory, Turn


def needed_facts(record: QARecord) -> list[str]:
    """The facts the question needs (`memrl.data.records.supporting_facts`): the record's own
    `facts`, else the first sentence of each supporting document, in document order."""
    return supporting_facts(record)


def oracle_memory(facts: Sequence[str], read: str, no_memory: str) -> str:
    """The facts whose whole sentence occurs in the text `read` so far, in order of
    appearance, joined by spaces; `no_memory` when none has appeared."""
    seen = sorted((read.find(f), f) for f in dict.fromkeys(facts) if f in read)
    return " ".join(f for _, f in seen) if seen else no_memory


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w+")


def hard_distractor(record: QARecord, facts: Sequence[str]) -> str | None:
    """The context's sentence that is not (part of) a needed fact and shares the most distinct
    words (case-insensitive) with the question, the first of equals; None when no sentence
    shares a word. On the biographies task that is a namesake's sentence about the asked
    attribute ("Dajal Abc was born in Peru." for "In which country was Dajal Xyz born?")."""
    asked = {w.lower() for w in _WORD.findall(record.question)}
    best, best_overlap = None, 0
    for sentence in _SENTENCE_END.split(record.render_context()):
        sentence = sentence.strip()
        if not sentence or any(sentence in f or f in sentence for f in facts):
            continue
        overlap = len(asked & {w.lower() for w in _WORD.findall(sentence)})
        if overlap > best_overlap:
            best, best_overlap = sentence, overlap
    return best


def corrected(record_id: str, share: float) -> bool:
    """Whether the oracle's episode of `record_id` makes (and corrects) a mistake: a stable
    hash of the id below `share` of its range."""
    return share > 0 and zlib.crc32(record_id.encode()) < share * 2**32


def _template_pattern(template: str) -> re.Pattern[str]:
    """A regex matching a filled template, capturing prompt / memory / chunk."""
    parts = re.split(r"\{(prompt|memory|chunk)\}", template)
    out = []
    for i, part in enumerate(parts):
        out.append(re.escape(part) if i % 2 == 0 else f"(?P<{part}>.*?)")
    return re.compile("".join(out), re.DOTALL)


class OracleGenerator:
    """A `Generator` answering MemAgent prompts for known records as the oracle would.

    Responses end with the tokenizer's end-of-turn token (finish_reason "stop"), as a model's
    would, so a model fine-tuned on them learns to stop. Log-probs are 0 (not sampled).
    """

    def __init__(
        self, tokenizer: Any, records: Sequence[QARecord], config: MemAgentConfig
    ) -> None:
        self.tokenizer = tokenizer
        self.agent = MemAgent(self, config)
        """The agent whose chunking and prompts the oracle answers (run it, or any MemAgent
        of the same config, over this generator)."""
        prompts: MemAgentPrompts = self.agent.prompts
        self._update = _template_pattern(prompts.update_template)
        self._final = _template_pattern(prompts.final_template)
        self._records: dict[str, list[QARecord]] = {}
        for r in records:
            if not needed_facts(r):
                raise MemrlInputError(
                    f"record {r.id} has no supporting documents or facts: the oracle cannot "
                    "know which facts its question needs (use synthetic data, or a "
                    "trajectories file)",
                    location=r.id,
                )
            self._records.setdefault(r.question.strip(), []).append(r)
        self._chunks: dict[str, list[str]] = {}
        self._share = config.oracle_corrections
        self._distractors: dict[str, str | None] = {}
        self.mistakes: set[tuple[str, int]] = set()
        """(record id, chunk index) of every memory update answered with a mistake."""

    def respond(self, prompt_text: str) -> str:
        """The oracle's response to one decoded prompt."""
        final = self._final.search(prompt_text)
        update = self._update.search(prompt_text)
        if update is not None:
            chunk = update["chunk"]
            record, chunks = self._record_with(update["prompt"], chunk)
            index = chunks.index(chunk)
            read = "".join(chunks[: index + 1])
            facts = needed_facts(record)
            memory = self._memory(record, facts, read)
            if corrected(record.id, self._share):
                if record.id not in self._distractors:  # one scan of the context per record
                    self._distractors[record.id] = hard_distractor(record, facts)
                wrong = self._distractors[record.id]
                if wrong is not None and wrong in read and wrong not in read[: -len(chunk)]:
                    self.mistakes.add((record.id, index))
                    return wrong if memory == self.agent.prompts.no_memory else (
                        f"{memory} {wrong}")
            return memory
        if final is not None:
            gold = self._final_record(final["prompt"], final.groupdict().get("memory") or "").answers[0]
            if self.agent.prompts.answer_format == "answer_is":
                return f"Therefore, the answer is {gold}."
            return f"\\boxed{{{gold}}}"
        raise ValueError("the oracle got a prompt that is neither a memory update nor final")

    def _memory(self, record: QARecord, facts: Sequence[str], read: str) -> str:
        """The right memory after reading `read`: the tracked state for a state-tracking
        question, else the needed facts seen so far."""
        state = state_facts(record.question, read)
        if state is None:
            return oracle_memory(facts, read, self.agent.prompts.no_memory)
        return " ".join(state) or self.agent.prompts.no_memory

    def without_mistakes(self, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """The trajectories without the memory updates this oracle answered with a mistake
        (`mistakes`): their recoveries stay, the mistakes are never trained."""
        out = []
        for t in trajectories:
            turns = tuple(u for u in t.turns if not (
                isinstance(u.detail, MemAgentTurn) and u.detail.chunk_index is not None
                and (t.record_id, u.detail.chunk_index) in self.mistakes))
            out.append(t if len(turns) == len(t.turns) else dataclasses.replace(t, turns=turns))
        return out

    def _candidates(self, question: str) -> list[QARecord]:
        try:
            return self._records[question.strip()]
        except KeyError:
            raise ValueError(f"the oracle knows no record with question {question!r}") from None

    def _cut(self, record: QARecord) -> list[str]:
        return self._chunks.setdefault(record.id, self.agent.chunk(record).texts)

    def _record_with(self, question: str, chunk: str) -> tuple[QARecord, list[str]]:
        """The record asking `question` that was cut into `chunk` (records may share a
        question: "Where is John?"), and its chunks."""
        for record in self._candidates(question):
            if chunk in (chunks := self._cut(record)):
                return record, chunks
        raise ValueError(f"the oracle got a chunk of {question!r} it did not cut")

    def _final_record(self, question: str, memory: str) -> QARecord:
        """The record asking `question` whose right final memory is `memory` (the first of
        them, or of all that ask it when none is)."""
        candidates = self._candidates(question)
        if len(candidates) > 1:
            for record in candidates:
                read = "".join(self._cut(record))
                if self._memory(record, needed_facts(record), read) == memory.strip():
                    return record
        return candidates[0]

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        out = []
        for prompt, each in zip(prompts, request_params(prompts, params), strict=True):
            text = self.respond(self.tokenizer.decode(list(prompt), skip_special_tokens=False))
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), _eos(self.tokenizer)]
            finish = "stop"
            if len(ids) > each.max_new_tokens:
                ids, finish = ids[: each.max_new_tokens], "length"
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append(Generation(ids, [0.0] * len(ids), text, finish))
        return out


def _eos(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise MemrlInputError("the tokenizer has no end-of-turn (eos) token", location="model")
    return int(eos)


def replay_memagent(agent: MemAgent, record: QARecord, row: dict[str, Any]) -> Trajectory:
    """The Trajectory of one `memrl eval` trajectories line, its turns rebuilt with `agent`
    (its chunk_size and max_chunks must be the evaluation's: the chunk count is checked).

    A turn whose response was cut at its token limit ("memory_truncated" /
    "final_truncated") keeps finish_reason "length" and gets no end-of-turn token.
    """
    memories, where = row.get("memories"), f"trajectory {row.get('id')!r}"
    final = row.get("final_response")
    if not isinstance(memories, list) or not isinstance(final, str):
        raise MemrlInputError("needs 'memories' (a list) and 'final_response'", location=where)
    context = agent.chunk(record)
    chunks = context.texts
    if len(chunks) != len(memories):
        raise MemrlInputError(
            f"{len(memories)} logged memories but the record cuts into {len(chunks)} chunks: "
            "use the memagent.chunk_size / max_chunks of the evaluation",
            location=where,
        )
    cut = list(row.get("memory_truncated") or [False] * len(memories))
    eos, tok = _eos(agent.tokenizer), agent.tokenizer
    turns, memory = [], agent.prompts.no_memory
    for k, (chunk, new) in enumerate(zip(chunks, memories, strict=True)):
        prompt = agent.update_prompt_ids(record.question, memory, chunk)
        turns.append(_replayed("memory_update", prompt, tok, str(new), bool(cut[k]), eos, k))
        memory = str(new)
    prompt = agent.final_prompt_ids(record.question, memory)
    turns.append(
        _replayed("final", prompt, tok, final, bool(row.get("final_truncated")), eos, None)
    )
    return Trajectory(
        record_id=record.id,
        sample_index=int(row.get("sample_index", 0)),
        turns=tuple(turns),
        answer=row.get("answer"),
        metrics={k: float(v) for k, v in (row.get("scores") or {}).items()},
        details=MemAgentDetails(
            memories=tuple(str(m) for m in memories), num_chunks=len(chunks),
            context_tokens=context.context_tokens, capped=context.capped, final_response=final,
        ),
    )


def _replayed(kind: str, prompt: list[int], tokenizer: Any, text: str, truncated: bool,
              eos: int, chunk_index: int | None) -> Turn:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not truncated:
        ids.append(eos)
    return Turn(kind=kind, prompt_ids=prompt, response_ids=ids, response_logprobs=[0.0] * len(ids),
                response_text=text, finish_reason="length" if truncated else "stop",
                detail=MemAgentTurn(chunk_index))

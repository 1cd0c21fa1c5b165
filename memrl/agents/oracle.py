"""Teacher trajectories for a warm start: a scripted oracle, and replays of logged episodes.

Both produce real MemAgent `Trajectory`s (prompt and response token ids through the very
prompts and chunking of `MemAgent`), so supervised fine-tuning trains exactly the
conversations the agent will hold.

The oracle (`OracleGenerator`) plays the model inside an ordinary `MemAgent.run`: it reads
each prompt, finds its record by the question, and answers

    memory update:  the facts the question needs that have appeared so far, in document
                    order ("No previous memory" until the first one appears)
    final answer:   \\boxed{first gold answer}

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

import re
from collections.abc import Sequence
from typing import Any

from memrl.agents.memagent import MemAgent, MemAgentConfig, MemAgentDetails, MemAgentTurn
from memrl.agents.prompts import MemAgentPrompts
from memrl.data.records import QARecord, supporting_facts
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
        self._records: dict[str, QARecord] = {}
        for r in records:
            if not needed_facts(r):
                raise MemrlInputError(
                    f"record {r.id} has no supporting documents or facts: the oracle cannot "
                    "know which facts its question needs (use synthetic data, or a "
                    "trajectories file)",
                    location=r.id,
                )
            self._records.setdefault(r.question.strip(), r)
        self._chunks: dict[str, list[str]] = {}

    def respond(self, prompt_text: str) -> str:
        """The oracle's response to one decoded prompt."""
        final = self._final.search(prompt_text)
        update = self._update.search(prompt_text)
        if update is not None:
            record = self._record(update["prompt"])
            chunks = self._chunks.setdefault(record.id, self.agent.chunk(record).texts)
            chunk = update["chunk"]
            if chunk not in chunks:
                raise ValueError(f"the oracle got a chunk of {record.id} it did not cut")
            read = "".join(chunks[: chunks.index(chunk) + 1])
            return oracle_memory(needed_facts(record), read, self.agent.prompts.no_memory)
        if final is not None:
            return f"\\boxed{{{self._record(final['prompt']).answers[0]}}}"
        raise ValueError("the oracle got a prompt that is neither a memory update nor final")

    def _record(self, question: str) -> QARecord:
        try:
            return self._records[question.strip()]
        except KeyError:
            raise ValueError(f"the oracle knows no record with question {question!r}") from None

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

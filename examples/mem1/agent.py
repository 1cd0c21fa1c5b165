"""A MEM1-style agent, written outside memrl: file 1 of 3 (docs/architecture.md walks
through all three).

MEM1 (Zhou et al., 2025) keeps one internal state and drops its context every turn. Here
turn t sees only the question, the internal state it wrote at turn t-1 and the next
document of the record, and replies with a new internal state `<IS>...</IS>`, optionally
followed by `<answer>...</answer>`, which ends the episode. After the last document one
more turn must answer. Unlike MemAgent it reads whole documents (not token chunks) and may
stop early.

The episode is written once, as a coroutine: every model call is awaited through the
driver's `calls` (`memrl.inference.schedule`), which runs the episodes in lockstep on the HF
engine and as independent coroutines on vLLM. The agent neither scores nor imports
anything of `memrl.rl`: its task (task.py) does the scoring.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from memrl.data.records import QARecord
from memrl.inference.base import Sampler, episode_keys
from memrl.inference.chat import encode_chat
from memrl.inference.schedule import ModelCalls, run_episodes
from memrl.trajectory import Trajectory, Turn

PROMPT = (
    "Question: {question}\n\n"
    "What you have kept so far: {state}\n\n"
    "{observation}\n\n"
    "Rewrite what you keep inside <IS>...</IS>, only what helps answer the question. If you "
    "can answer now, add <answer>...</answer>."
)
FIRST_STATE = "nothing yet"
LAST_OBSERVATION = "There are no more documents: answer now."
_STATE = re.compile(r"<IS>(.*?)</IS>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_reply(text: str) -> tuple[str | None, str | None]:
    """(internal state, answer) of a reply: the last `<IS>` and `<answer>` contents, or
    None for what it lacks (regular expressions without nesting: linear time)."""
    states, answers = _STATE.findall(text), _ANSWER.findall(text)
    return (states[-1].strip() if states else None, answers[-1].strip() if answers else None)


@dataclass(frozen=True)
class Mem1Details:
    """What the agent kept of one episode: its internal state after every turn (a reply
    without `<IS>` keeps the previous one) and its last reply."""

    states: tuple[str, ...]
    final_response: str


class Mem1Agent:
    """Runs MEM1-style episodes over QA records (their documents, one per turn)."""

    def __init__(self, generator: Any, config: Any) -> None:
        self.generator = generator
        self.config = config

    def run(self, records: Sequence[QARecord], num_samples: int = 1, *, mode: str = "auto",
            keep_token_ids: bool = True) -> list[Trajectory]:
        """One trajectory per (record, sample), record by record; turn t of an episode is
        seeded by (seed, record id, occurrence, sample index, t) on either schedule."""
        cfg = self.config
        sample = Sampler(self.generator, temperature=cfg.temperature, top_p=cfg.top_p,
                         seed=cfg.seed)
        keys = iter(episode_keys([r.id for r in records], num_samples))
        episodes = [partial(self.episode, record, next(keys), sample, keep_token_ids)
                    for record in records for _ in range(num_samples)]
        return run_episodes(self.generator, episodes, mode)

    async def episode(self, record: QARecord, key: tuple[str, int, int], sample: Sampler,
                      keep_ids: bool, calls: ModelCalls) -> Trajectory:
        docs = [f"Document: {d.title}\n{d.text}" for d in record.documents] \
            or [record.render_context()]
        state, states, turns, text = FIRST_STATE, [], [], ""
        for t in range(len(docs) + 1):
            last = t == len(docs)
            prompt = encode_chat(self.generator.tokenizer, PROMPT.format(
                question=record.question, state=state,
                observation=LAST_OBSERVATION if last else docs[t]))
            gen = await calls.generate(prompt, sample.params(self.config.max_turn_tokens, *key, t))
            text = sample.text(gen)
            turns.append(Turn(
                kind="answer" if last else "read", prompt_ids=prompt if keep_ids else [],
                response_ids=list(gen.token_ids) if keep_ids else [],
                response_logprobs=list(gen.logprobs) if keep_ids else [],
                response_text=gen.text, finish_reason=gen.finish_reason,
                prompt_tokens=len(prompt), response_tokens=len(gen.token_ids)))
            new_state, answer = parse_reply(text)
            state = new_state if new_state is not None else state
            states.append(state)
            if answer is not None or last:
                break
        return Trajectory(record.id, key[2], tuple(turns),
                          details=Mem1Details(tuple(states), text))

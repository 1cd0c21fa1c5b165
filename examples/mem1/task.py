"""A MEM1-style agent written outside memrl (Zhou et al., 2025), in one file and a config.

MEM1 keeps one internal state and drops its context every turn: turn t sees the question,
the state it wrote at turn t-1 and the record's next document, and replies with a new state
`<IS>...</IS>`, optionally with `<answer>...</answer>`, which ends the episode; after the
last document one more turn must answer. memrl runs the episodes (sampling, seeding, either
schedule), sums the named rewards and logs them. By import path, no edit to memrl:

    memrl train examples/mem1/config.yaml ...          # agent: mem1.task:Mem1Task
    memrl eval agent=mem1.task:Mem1Task ...            # (with examples/ on PYTHONPATH)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from memrl.data.hotpotqa import load_hotpotqa
from memrl.data.records import QARecord, supporting_facts
from memrl.inference.scripted import ScriptedGenerator
from memrl.rewards.qa import qa_scores
from memrl.tasks import EpisodeModel, Task
from memrl.trajectory import Trajectory

PROMPT = ("Question: {question}\n\nWhat you have kept so far: {state}\n\n{observation}\n\n"
          "Rewrite what you keep inside <IS>...</IS>, only what helps answer the question. "
          "If you can answer now, add <answer>...</answer>.")
FIRST_STATE = "nothing yet"
LAST_OBSERVATION = "There are no more documents: answer now."


def parse_reply(text: str) -> tuple[str | None, str | None]:
    """(internal state, answer) of a reply: the last `<IS>` and `<answer>` contents, or None
    for what it lacks (regular expressions without nesting: linear time)."""
    states = re.findall(r"<IS>(.*?)</IS>", text, re.DOTALL)
    answers = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return (states[-1].strip() if states else None, answers[-1].strip() if answers else None)


class Mem1Config(BaseModel):
    """The `mem1:` section of a config."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_turn_tokens: int = Field(64, ge=1)
    """New tokens per turn (internal state and answer together)."""


@dataclass(frozen=True)
class Mem1Details:
    """The internal state after every turn (a reply without `<IS>` keeps the last one) and
    the last reply."""

    states: tuple[str, ...]
    final_response: str


def early_stop(trajectory: Trajectory, record: QARecord) -> float:
    """The share of documents left unread when the agent answered (0 without an answer)."""
    if trajectory.answer is None:
        return 0.0
    read = sum(turn.kind == "read" for turn in trajectory.turns)
    return 1.0 - read / max(len(record.documents), 1)


class Mem1Task(Task):
    name = "mem1"
    config_class = Mem1Config
    reward_functions = {"em": lambda t, record: t.metrics["em"], "early_stop": early_stop}

    def load(self, path: str, fmt: str, *, what: str) -> list[QARecord]:
        return load_hotpotqa(path, format=fmt)

    async def episode(self, record: QARecord, model: EpisodeModel) -> Mem1Details:
        docs = [f"Document: {d.title}\n{d.text}" for d in record.documents] \
            or [record.render_context()]
        state, states, text = FIRST_STATE, [], ""
        for t in range(len(docs) + 1):
            last = t == len(docs)
            prompt = model.chat(PROMPT.format(question=record.question, state=state,
                                              observation=LAST_OBSERVATION if last else docs[t]))
            text = await model.generate(prompt, max_new_tokens=self.config.max_turn_tokens,
                                        kind="answer" if last else "read")
            new_state, answer = parse_reply(text)
            states.append(state := new_state if new_state is not None else state)
            if answer is not None:
                break
        return Mem1Details(tuple(states), text)

    def score(self, trajectory: Trajectory, record: QARecord) -> Trajectory:
        answer = parse_reply(trajectory.details.final_response)[1]
        return dataclasses.replace(trajectory, answer=answer,
                                   metrics=qa_scores(answer, record.answers))

    def oracle(self, tokenizer, records: list[QARecord]) -> ScriptedGenerator:
        """The warm start's teacher (`memrl sft`): it keeps the facts the question needs as
        their documents are read and answers the gold as soon as it holds them all."""
        needs = {r.question: (supporting_facts(r), r.answers[0]) for r in records}

        def respond(prompt: str) -> str:
            question = prompt.split("Question: ", 1)[1].split("\n\n", 1)[0]
            kept = prompt.split("What you have kept so far: ", 1)[1].split("\n\n", 1)[0]
            facts, gold = needs[question]
            held = [f for f in facts if f in kept or f in prompt]
            done = len(held) == len(facts) or LAST_OBSERVATION in prompt
            return f"<IS>{' '.join(held) or FIRST_STATE}</IS>" \
                + (f"<answer>{gold}</answer>" if done else "")

        return ScriptedGenerator(tokenizer, respond, end_with_eos=True)

    def summarize(self, trajectories: list[Trajectory]) -> dict[str, float]:
        if not trajectories:
            return {}
        return {"accuracy": float(np.mean([t.metrics["em"] for t in trajectories])),
                "turns": float(np.mean([len(t.details.states) for t in trajectories])),
                **{k: float(np.mean([t.metrics[k] for t in trajectories]))
                   for k in trajectories[0].metrics if k.startswith("reward/")}}

    def log_row(self, trajectory: Trajectory, record: QARecord) -> dict:
        return {"id": trajectory.record_id, "sample_index": trajectory.sample_index,
                "question": record.question, "answers": record.answers,
                "states": list(trajectory.details.states), "answer": trajectory.answer,
                "final_response": trajectory.details.final_response,
                "reward": trajectory.reward, "scores": dict(trajectory.metrics)}

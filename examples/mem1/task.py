"""The MEM1-style agent's task, written outside memrl: file 2 of 3.

A Task is what memrl trains and evaluates: a name (its config section's key), its config
class, its named rewards, and `load` / `rollout` / `summarize` / `log_row`
(`memrl.tasks.base.Task`). Name it by import path and memrl needs no edit:

    memrl train examples/mem1/config.yaml ...              # agent: mem1.task:Mem1Task
    memrl eval agent --agent mem1.task:Mem1Task ...        # (with examples/ on PYTHONPATH)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from memrl.data.hotpotqa import load_hotpotqa
from memrl.data.records import QARecord, supporting_facts
from memrl.errors import MemrlInputError
from memrl.inference.scripted import ScriptedGenerator
from memrl.rewards.qa import qa_scores
from memrl.tasks import reward_of, reward_weights, weighted_rewards
from memrl.tasks.rewards import reward_means
from memrl.trajectory import Trajectory

from mem1.agent import LAST_OBSERVATION, Mem1Agent, parse_reply


class Mem1Config(BaseModel):
    """The `mem1:` section of a config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turn_tokens: int = Field(64, ge=1)
    """New tokens per turn (internal state and answer together)."""
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0)


def exact_match(trajectory: Trajectory, record: QARecord) -> float:
    """1 when the answer matches a gold answer exactly (after normalisation)."""
    return trajectory.metrics["em"]


def early_stop(trajectory: Trajectory, record: QARecord) -> float:
    """The share of documents left unread when the agent answered (0 without an answer)."""
    if trajectory.answer is None:
        return 0.0
    read = sum(turn.kind == "read" for turn in trajectory.turns)
    return 1.0 - read / max(len(record.documents), 1)


class Mem1Task:
    name: ClassVar[str] = "mem1"
    config_class: ClassVar[type] = Mem1Config
    rewards: ClassVar[tuple[str, ...]] = ("em", "early_stop")
    reward_functions: ClassVar[dict[str, Any]] = {"em": exact_match, "early_stop": early_stop}

    def __init__(self, config: Mem1Config, reward: Any = None) -> None:
        self.config = config
        self.weights = reward_weights(reward, self.rewards, agent=self.name)

    @classmethod
    def from_config(cls, config: Any) -> Mem1Task:
        return cls(config.agent_config, reward_of(config))

    def load(self, path: str, fmt: str, *, what: str) -> list[QARecord]:
        records = load_hotpotqa(path, format=fmt)
        if not records:
            raise MemrlInputError(f"{what} file holds no questions", location=path)
        return records

    def rollout(self, generator: Any, records: Sequence[QARecord], *, num_samples: int,
                seed: int | None, temperature: float | None = None,
                keep_token_ids: bool = True, progress: Any = None, top_p: float | None = None,
                mode: str = "auto") -> list[Trajectory]:
        update = {"seed": seed, **({"temperature": temperature} if temperature is not None
                                   else {}), **({"top_p": top_p} if top_p is not None else {})}
        agent = Mem1Agent(generator, self.config.model_copy(update=update))
        by_id = {r.id: r for r in records}
        scored = []
        for t in agent.run(records, num_samples, mode=mode, keep_token_ids=keep_token_ids):
            _, answer = parse_reply(t.details.final_response)
            scores = qa_scores(answer, by_id[t.record_id].answers)
            scored.append(dataclasses.replace(t, answer=answer, metrics=scores))
        return weighted_rewards(scored, by_id, self.reward_functions, self.weights)

    def oracle(self, tokenizer: Any, records: Sequence[QARecord]) -> ScriptedGenerator:
        """The warm start's teacher (`memrl sft`): it keeps the facts the question needs as
        their documents are read and answers the gold as soon as it holds them all."""
        needs = {r.question: (supporting_facts(r), r.answers[0]) for r in records}

        def respond(prompt: str) -> str:
            question = prompt.split("Question: ", 1)[1].split("\n\n", 1)[0]
            kept = prompt.split("What you have kept so far: ", 1)[1].split("\n\n", 1)[0]
            facts, gold = needs[question]
            held = [f for f in facts if f in kept or f in prompt]
            state = " ".join(held) or "nothing yet"
            done = len(held) == len(facts) or LAST_OBSERVATION in prompt
            return f"<IS>{state}</IS>" + (f"<answer>{gold}</answer>" if done else "")

        return ScriptedGenerator(tokenizer, respond, end_with_eos=True)

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        if not trajectories:
            return {}
        return {"accuracy": float(np.mean([t.metrics["em"] for t in trajectories])),
                "turns": float(np.mean([len(t.details.states) for t in trajectories])),
                **reward_means(trajectories)}

    def log_row(self, trajectory: Trajectory, record: QARecord) -> dict[str, Any]:
        return {"id": trajectory.record_id, "sample_index": trajectory.sample_index,
                "question": record.question, "answers": record.answers,
                "states": list(trajectory.details.states),
                "final_response": trajectory.details.final_response,
                "answer": trajectory.answer, "reward": trajectory.reward,
                "scores": {k: v for k, v in trajectory.metrics.items()}}

"""MemAgent on long-document QA: chunked reading, overwritten memory, boxed answer.

The task owns what the agent leaves open: it extracts the answer from the final response
(the last `\\boxed{}`), scores it (EM, F1, sub-EM against every gold answer) and turns one
score into the reward. Training and `memrl eval ruler-hqa` both roll out through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from memrl.agents.memagent import MemAgent, MemAgentConfig
from memrl.agents.trajectory import Trajectory
from memrl.data.records import QARecord
from memrl.errors import MemrlInputError
from memrl.inference.base import Generator
from memrl.rewards.memagent import memagent_em
from memrl.rewards.qa import extract_boxed, qa_scores
from memrl.rewards.shaping import context_overlap_reward

REWARDS = ("sub_em", "em", "f1", "memagent_em", "context_overlap")
"""Rewards of the final answer; memagent_em is MemAgent's published training reward
(`memrl.rewards.memagent.memagent_em` of the final response); context_overlap is a dense
smoke-test reward for tiny random models (memrl.rewards.shaping), not a measure of answer
quality."""


def score_trajectory(trajectory: Trajectory, record: QARecord) -> dict[str, float]:
    """Set the trajectory's answer (last \\boxed{} of the final response) and its QA scores
    (`trajectory.metrics`); return the scores."""
    trajectory.answer = extract_boxed(trajectory.info["final_response"])
    scores = qa_scores(trajectory.answer, record.answers)
    trajectory.metrics.update(scores)
    return scores


def trajectory_row(t: Trajectory, record: QARecord) -> dict[str, Any]:
    """One line of a trajectories file (no context: it is in the data file)."""
    updates = [turn for turn in t.turns if turn.kind == "memory_update"]
    final = next(turn for turn in t.turns if turn.kind == "final")
    return {
        "id": t.record_id,
        "sample_index": t.sample_index,
        "num_docs": record.num_docs or 0,
        "question": record.question,
        "answers": record.answers,
        "memories": t.info["memories"],
        "memory_tokens": [turn.meta["response_tokens"] for turn in updates],
        "memory_truncated": [turn.truncated for turn in updates],
        "final_response": t.info["final_response"],
        "final_truncated": final.truncated,
        "answer": t.answer,
        "scores": {k: t.metrics[k] for k in ("em", "f1", "sub_em") if k in t.metrics},
        "num_chunks": t.info["num_chunks"],
        "context_tokens": t.info["context_tokens"],
        "capped": t.info["capped"],
    }


class MemAgentQATask:
    """Reward: em / f1 / sub_em of the \\boxed{} answer, or the dense context_overlap."""

    name: ClassVar[str] = "memagent"
    rewards: ClassVar[tuple[str, ...]] = REWARDS

    def __init__(self, config: MemAgentConfig, reward: str = "sub_em") -> None:
        if reward not in REWARDS:
            raise MemrlInputError(
                f"unknown reward {reward!r} for the memagent task; choose one of "
                + ", ".join(REWARDS),
                location="rl.reward",
            )
        self.config = config
        self.reward = reward
        self._context_ids: dict[str, frozenset[int]] = {}

    @classmethod
    def from_config(cls, config: Any) -> MemAgentQATask:
        """From a TrainConfig: its `memagent` section and `rl.reward`."""
        return cls(config.memagent, reward=config.rl.reward or REWARDS[0])

    @property
    def sampling_temperature(self) -> float:
        return self.config.temperature

    def load(self, path: str, fmt: str, *, what: str) -> list[QARecord]:
        if fmt == "ruler":
            from memrl.data.ruler_hqa import load_ruler_hqa

            records = load_ruler_hqa(path)
        else:
            from memrl.data.hotpotqa import load_hotpotqa

            records = load_hotpotqa(path, format=fmt)
        if not records:
            raise MemrlInputError(f"{what} file holds no questions", location=path)
        return records

    def rollout(
        self,
        generator: Generator,
        records: Sequence[QARecord],
        *,
        num_samples: int,
        seed: int | None,
        temperature: float | None = None,
        keep_token_ids: bool = True,
        progress: Callable[[Any], None] | None = None,
        top_p: float | None = None,
    ) -> list[Trajectory]:
        update: dict[str, Any] = {"seed": seed}
        if temperature is not None:
            update["temperature"] = temperature
        if top_p is not None:
            update["top_p"] = top_p
        agent = MemAgent(generator, self.config.model_copy(update=update))
        trajectories = agent.run(
            records, num_samples=num_samples, progress=progress, keep_token_ids=keep_token_ids
        )
        by_id = {r.id: r for r in records}
        for t in trajectories:
            record = by_id[t.record_id]
            scores = score_trajectory(t, record)
            if self.reward == "context_overlap":
                t.reward = self._overlap(t, record, generator.tokenizer)
            elif self.reward == "memagent_em":
                t.reward = memagent_em(t.info["final_response"], record.answers)
                t.metrics["memagent_em"] = t.reward
            else:
                t.reward = scores[self.reward]
        return trajectories

    def _overlap(self, trajectory: Trajectory, record: QARecord, tokenizer: Any) -> float:
        if record.id not in self._context_ids:
            ids = tokenizer.encode(record.render_context(), add_special_tokens=False)
            self._context_ids[record.id] = frozenset(ids)
        response = trajectory.turns[-1].response_ids
        return context_overlap_reward(response, self._context_ids[record.id])

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        if not trajectories:
            return {}
        mean = lambda key: float(np.mean([t.metrics.get(key, 0.0) for t in trajectories]))  # noqa: E731
        return {
            "accuracy": mean("sub_em"),
            "em": mean("em"),
            "f1": mean("f1"),
            "no_answer": float(np.mean([t.answer is None for t in trajectories])),
            "chunks_per_episode": float(
                np.mean([t.info.get("num_chunks", 0) for t in trajectories])
            ),
        }

    def log_row(self, trajectory: Trajectory, record: QARecord) -> dict[str, Any]:
        return {**trajectory_row(trajectory, record), "reward": trajectory.reward}

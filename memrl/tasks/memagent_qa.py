"""MemAgent on long-document QA: chunked reading, overwritten memory, boxed answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memrl.agents.memagent import MemAgent, MemAgentConfig
from memrl.agents.trajectory import Trajectory
from memrl.data.records import QARecord
from memrl.errors import MemrlInputError
from memrl.eval.ruler_hqa import score_trajectories, trajectory_row
from memrl.inference.base import Generator
from memrl.rewards.qa import qa_scores
from memrl.rewards.shaping import context_overlap_reward


class MemAgentQATask:
    """Reward: em / f1 / sub_em of the \\boxed{} answer, or the dense context_overlap."""

    name = "memagent"

    def __init__(self, config: MemAgentConfig, reward: str = "sub_em") -> None:
        self.config = config
        self.reward = reward
        self._context_ids: dict[str, frozenset[int]] = {}

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
        seed: int,
        temperature: float | None = None,
    ) -> list[Trajectory]:
        update: dict[str, Any] = {"seed": seed}
        if temperature is not None:
            update["temperature"] = temperature
        agent = MemAgent(generator, self.config.model_copy(update=update))
        trajectories = agent.run(records, num_samples=num_samples)
        score_trajectories(trajectories, records)
        by_id = {r.id: r for r in records}
        for t in trajectories:
            t.reward = self._reward(t, by_id[t.record_id], generator.tokenizer)
        return trajectories

    def _reward(self, trajectory: Trajectory, record: QARecord, tokenizer: Any) -> float:
        if self.reward == "context_overlap":
            if record.id not in self._context_ids:
                ids = tokenizer.encode(record.render_context(), add_special_tokens=False)
                self._context_ids[record.id] = frozenset(ids)
            response = trajectory.turns[-1].response_ids
            return context_overlap_reward(response, self._context_ids[record.id])
        return qa_scores(trajectory.answer, record.answers)[self.reward]

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
        row = trajectory_row(trajectory, record, record.num_docs or 0, trajectory.metrics)
        return {**row, "reward": trajectory.reward}

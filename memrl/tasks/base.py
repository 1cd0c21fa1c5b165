"""A Task is one agent workflow with its data and its reward, as the trainer sees it.

The trainer (`memrl.rl`) only calls these methods and reads the Trajectories they return,
so it never knows which agent produced them; adding an agent means adding a Task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from memrl.agents.trajectory import Trajectory
from memrl.inference.base import Generator


class Task(Protocol):
    name: str

    @property
    def sampling_temperature(self) -> float:
        """Temperature of training rollouts (the trainer scales logits by it too)."""
        ...

    def load(self, path: str, fmt: str, *, what: str) -> list[Any]:
        """Read training or validation records; each has a unique string `.id`."""
        ...

    def rollout(
        self,
        generator: Generator,
        records: Sequence[Any],
        *,
        num_samples: int,
        seed: int,
        temperature: float | None = None,
    ) -> list[Trajectory]:
        """`num_samples` trajectories per record (record_id = record.id), each with its
        scalar `reward` and per-trajectory scores in `metrics` already set."""
        ...

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Task metrics averaged over trajectories (e.g. accuracy, f1), without prefix."""
        ...

    def log_row(self, trajectory: Trajectory, record: Any) -> dict[str, Any]:
        """One JSON-serialisable line describing a trajectory, for sample logs."""
        ...

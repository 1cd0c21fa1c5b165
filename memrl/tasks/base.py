"""A Task is one agent workflow with its data and its reward, as training and evaluation see it.

The recipe (`memrl.recipes`) and the evaluations (`memrl.eval`) only call these methods and
read the Trajectories they return; `memrl.rl` never sees a task at all. Adding an agent means
adding a Task and registering it in `memrl.tasks.TASKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from memrl.trajectory import Trajectory
from memrl.inference.base import Generator, RolloutMode


class Task(Protocol):
    name: ClassVar[str]
    rewards: ClassVar[tuple[str, ...]]
    """Reward names this task accepts for `rl.reward`; the first is its default."""

    @classmethod
    def from_config(cls, config: Any) -> Task:
        """Build from a training config: its `<name>` section and `rl.reward`."""
        ...

    @property
    def sampling_temperature(self) -> float:
        """Temperature of training rollouts (the actor scales logits by it too)."""
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
        keep_token_ids: bool = True,
        progress: Callable[[Any], None] | None = None,
        top_p: float | None = None,
        mode: RolloutMode = "auto",
    ) -> list[Trajectory]:
        """`num_samples` trajectories per record (record_id = record.id), each with its
        scalar `reward` and per-trajectory scores in `metrics` already set.
        `keep_token_ids=False` drops token ids from turns (evaluation does not train).
        `temperature` / `top_p` (None: the agent config's) override sampling, e.g. for
        validation. `mode` schedules the agent's episodes (lockstep / async / auto:
        `memrl.inference.base.RolloutMode`); it changes speed, not trajectories, on an engine
        that seeds each request on its own."""
        ...

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Task metrics averaged over trajectories (e.g. accuracy, f1), without prefix."""
        ...

    def log_row(self, trajectory: Trajectory, record: Any) -> dict[str, Any]:
        """One JSON-serialisable line describing a trajectory, for sample logs."""
        ...

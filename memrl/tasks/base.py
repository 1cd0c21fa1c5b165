"""A Task is one agent workflow with its data and its reward, as training and evaluation see it.

The recipe (`memrl.recipes`), the evaluation runner (`memrl.eval.runner`) and the viewer
only call these methods and read the Trajectories they return; `memrl.rl` never sees a task
at all. Adding an agent means writing its agent module and a Task, then either one line in
`memrl.tasks.TASKS` or nothing (name it by import path `package.module:Class`).

Besides the protocol below a task class may define:
- `render_row(row, source) -> str`: the HTML of one log row in `memrl view` (else the
  generic renderer);
- `oracle(tokenizer, records) -> Generator`: a scripted teacher whose rollouts `memrl sft`
  imitates (the warm start), built only from the records it is given;
- `replay(tokenizer, record, row) -> Trajectory`: one line of a trajectories file (of a
  teacher model, filtered by score) rebuilt as this agent's turns, for `memrl sft` with
  `data.trajectories`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from memrl.trajectory import Trajectory
from memrl.inference.base import Generator, RolloutMode


class Task(Protocol):
    name: ClassVar[str]
    """The agent's name: the key of its config section (an identifier)."""
    config_class: ClassVar[type]
    """The pydantic model of its config section (`extra="forbid"`: unknown keys are errors)."""
    rewards: ClassVar[tuple[str, ...]]
    """Names of the rewards this task computes, for `rl.reward` (a name, or {name: weight});
    the first is its default. `memrl.tasks.rewards.weighted_rewards` sums the chosen parts
    and keeps each one in the trajectory's metrics as `reward/<name>`."""

    @classmethod
    def from_config(cls, config: Any) -> Task:
        """Build from a config: its section (`config.agent_config`) and the reward it asks
        for (`memrl.tasks.reward_of(config)`: `rl.reward`, None in the warm start's config)."""
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
        `temperature` / `top_p` (None: the agent config's) override sampling: training
        passes `rollout.temperature` / `top_p`, validation `rollout.val.*`; the evaluation
        commands leave them None. `mode` schedules the agent's episodes (lockstep / async / auto:
        `memrl.inference.base.RolloutMode`); it changes speed, not trajectories, on an engine
        that seeds each request on its own."""
        ...

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Task metrics averaged over trajectories (e.g. accuracy, f1), without prefix.
        Training passes the step's trajectories without their turns (gathered from every
        rank): read answers, metrics and details, not turns."""
        ...

    def log_row(self, trajectory: Trajectory, record: Any) -> dict[str, Any]:
        """One JSON-serialisable line describing a trajectory (trajectories files, sample
        logs): at least `id`, `sample_index`, `reward` and `scores` (name → number), which
        the evaluation runner keys, resumes and averages by."""
        ...

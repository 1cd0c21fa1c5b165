"""A Task is one agent workflow with its data and its reward, as training and evaluation see it.

The recipe (`memrl.recipes`), the evaluation runner (`memrl.eval.runner`) and the viewer
only call `rollout`, `summarize` and `log_row` and read the Trajectories they get; `memrl.rl`
never sees a task at all. A task subclasses `Task` and gives:

- `name` (its config section's key), `config_class` (that section's pydantic model);
- `load(path, fmt, what=...)`: its records, each with a unique string `.id`;
- the episode: `async def episode(self, record, model)` that awaits
  `model.generate(prompt, max_new_tokens=...)` (`memrl.inference.schedule.EpisodeModel`)
  and returns the episode's details, or, for an agent with its own driver, `play`;
- `score(trajectory, record)`: a copy with its answer and per-trajectory scores (`metrics`);
- `reward_functions`: named rewards (trajectory, record) → float, summed with the weights
  `rl.reward` chooses (`memrl.tasks.rewards`);
- `summarize` and `log_row`.

`Task.rollout(engine, records, spec)` is written once, here: sampling (`RolloutSpec`: the
config's `rollout.*`, or the task's `sampling` when the spec leaves it open), the seeding
key of every request, the schedule, scoring, the weighted rewards and progress events.

Optional abilities are typed protocols, checked where they are used (`isinstance`):
`HasOracle` (the warm start's scripted teacher), `CanReplay` (a teacher's trajectories file
rebuilt as this agent's turns), `RendersRows` (its rows' HTML in `memrl view`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Protocol, runtime_checkable

from memrl.inference.base import Generator, RolloutMode, Sampler, episode_keys
from memrl.inference.schedule import EpisodeModel, ModelCalls, ProgressEvent, run_episodes
from memrl.tasks.rewards import RewardFunction, reward_of, reward_weights, weighted_rewards
from memrl.trajectory import Trajectory


@dataclass(frozen=True)
class Sampling:
    """How a task samples where the rollout does not say (`Task.sampling`)."""

    temperature: float = 1.0
    top_p: float = 1.0


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout's settings: the same for training, validation and evaluation."""

    num_samples: int = 1
    """Trajectories per record (GRPO's group size, `rollout.n`)."""
    seed: int | None = None
    """Base seed: call t of episode (record id, occurrence, sample index) samples with
    `derive_seed(seed, record id, occurrence, sample index, t)`; None leaves it unseeded."""
    temperature: float | None = None
    """`rollout.temperature` (None: the task's `sampling`)."""
    top_p: float | None = None
    """`rollout.top_p` (None: the task's `sampling`)."""
    keep_token_ids: bool = True
    """False drops token ids from the turns (evaluation does not train)."""
    progress: Callable[[Any], None] | None = None
    """Called with each ProgressEvent."""
    mode: RolloutMode = "auto"
    """The schedule (`memrl.inference.base.RolloutMode`): speed only, on an engine that seeds
    each request on its own."""


def rollout_spec(spec: RolloutSpec | None, options: Mapping[str, Any]) -> RolloutSpec:
    """`spec`, or one made of keyword options (`num_samples=`, `seed=`, ...), not both."""
    if spec is not None and options:
        raise TypeError(f"give a RolloutSpec or keywords, not both: {', '.join(options)}")
    return spec if spec is not None else RolloutSpec(**options)


class Task:
    """The base of every task: subclasses give what the module docstring lists."""

    name: ClassVar[str]
    """The agent's name: the key of its config section (an identifier)."""
    config_class: ClassVar[type]
    """The pydantic model of its config section (`extra="forbid"`: unknown keys are errors)."""
    rewards: ClassVar[tuple[str, ...]]
    """Names of its rewards for `rl.reward`, the first its default (from a class-level
    `reward_functions` when not given)."""
    reward_functions: Mapping[str, RewardFunction]
    """Name → (scored trajectory, record) → float; each chosen part is kept in the
    trajectory's metrics as `reward/<name>`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        functions = cls.__dict__.get("reward_functions")
        if "rewards" not in cls.__dict__ and isinstance(functions, Mapping):
            cls.rewards = tuple(functions)

    def __init__(self, config: Any, reward: str | Mapping[str, float] | None = None) -> None:
        self.config = config
        self.weights = reward_weights(reward, self.rewards, agent=self.name)

    @classmethod
    def from_config(cls, config: Any) -> Task:
        """From a config: its agent section (`config.agent_config`) and `rl.reward`."""
        return cls(config.agent_config, reward=reward_of(config))

    # ---- what a task gives ------------------------------------------------------------

    def load(self, path: str, fmt: str, *, what: str) -> list[Any]:
        """Read training or validation records; each has a unique string `.id`."""
        raise NotImplementedError

    async def episode(self, record: Any, model: EpisodeModel) -> Any:
        """One episode over `record`: its model calls awaited through `model`; returns the
        trajectory's `details` (the turns are the calls `model` kept)."""
        raise NotImplementedError(f"{type(self).__name__} writes neither episode nor play")

    def score(self, trajectory: Trajectory, record: Any) -> Trajectory:
        """A copy with the answer and the scores its rewards read (`metrics`)."""
        raise NotImplementedError

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Task metrics averaged over trajectories, without prefix. Training passes them
        without their turns: read answers, metrics and details."""
        raise NotImplementedError

    def log_row(self, trajectory: Trajectory, record: Any) -> dict[str, Any]:
        """One JSON line of a trajectory: at least `id`, `sample_index`, `reward` and
        `scores` (name → number), which the evaluation runner keys, resumes and averages."""
        raise NotImplementedError

    # ---- what a task may change ---------------------------------------------------------

    def sampling(self) -> Sampling:
        """The sampling of a rollout whose spec leaves it open (the evaluation commands)."""
        return Sampling()

    def prepare(self, records: Sequence[Any]) -> list[Any]:
        """The records as the episodes and the scoring see them (default: as given)."""
        return list(records)

    def play(self, engine: Generator, records: Sequence[Any], spec: RolloutSpec,
             sampler: Sampler) -> list[Trajectory]:
        """Unscored trajectories, record by record, samples 0..n-1: each (record, sample)
        runs `episode` on the spec's schedule. A task with an agent of its own overrides it."""
        keys = iter(episode_keys([r.id for r in records], spec.num_samples))
        episodes = [partial(self._drive, record, next(keys), sampler, spec)
                    for record in records for _ in range(spec.num_samples)]
        report(spec, ProgressEvent("start", episodes=len(episodes)))
        return run_episodes(engine, episodes, spec.mode)

    async def _drive(self, record: Any, key: tuple[str, int, int], sampler: Sampler,
                     spec: RolloutSpec, calls: ModelCalls) -> Trajectory:
        model = EpisodeModel(calls, sampler, key, keep_ids=spec.keep_token_ids)
        details = await self.episode(record, model)
        report(spec, ProgressEvent("final", episodes=1,
                                   turn=model.turns[-1] if model.turns else None))
        return Trajectory(record.id, key[2], tuple(model.turns), details=details)

    def score_all(self, engine: Generator, trajectories: Sequence[Trajectory],
                  records: Mapping[str, Any], spec: RolloutSpec) -> list[Trajectory]:
        """Scored copies (`score` each; a task scoring in batches overrides it)."""
        return [self.score(t, records[t.record_id]) for t in trajectories]

    # ---- the rollout, once ------------------------------------------------------------

    def rollout(self, engine: Generator, records: Sequence[Any], spec: RolloutSpec | None = None,
                /, **options: Any) -> list[Trajectory]:
        """`spec.num_samples` scored trajectories per record (record_id = record.id), each
        with its weighted `reward` and its scores in `metrics`. Keywords may stand for the
        spec (`rollout(engine, records, num_samples=2, seed=0)`)."""
        spec = rollout_spec(spec, options)
        if spec.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {spec.num_samples}")
        default = self.sampling()
        sampler = Sampler(
            engine, seed=spec.seed,
            temperature=default.temperature if spec.temperature is None else spec.temperature,
            top_p=default.top_p if spec.top_p is None else spec.top_p)
        records = self.prepare(records)
        trajectories = self.play(engine, records, spec, sampler)
        by_id = {r.id: r for r in records}
        scored = self.score_all(engine, trajectories, by_id, spec)
        return weighted_rewards(scored, by_id, self.reward_functions, self.weights)


def report(spec: RolloutSpec, event: ProgressEvent) -> None:
    """Hand `event` to the spec's progress callback, if any."""
    if spec.progress is not None:
        spec.progress(event)


@runtime_checkable
class HasOracle(Protocol):
    def oracle(self, tokenizer: Any, records: Sequence[Any]) -> Generator:
        """A scripted teacher whose rollouts `memrl sft` imitates (the warm start), built
        only from the records it is given."""
        ...


@runtime_checkable
class CanReplay(Protocol):
    def replay(self, tokenizer: Any, record: Any, row: dict[str, Any]) -> Trajectory:
        """One line of a trajectories file (of a teacher model, filtered by score) rebuilt
        as this agent's turns, for `memrl sft` with `data.trajectories`."""
        ...


@runtime_checkable
class RendersRows(Protocol):
    def render_row(self, row: dict[str, Any], source: str) -> str:
        """The HTML of one log row in `memrl view` (else the generic renderer)."""
        ...

"""The metrics of one GRPO step, kept apart from the algorithm (verl's
`trainer/ppo/metric_utils.py` is the model):

    phases = Phases(step)               with phases("rollout"): ...   (heartbeat + clock)
    view   = StepView.of(...).gathered(dist, order)   what the metrics are computed from
    step_metrics(view, task, phases, ...)
        = data_metrics        train/*: rewards, groups, lengths, advantages, KL penalty
        + train/lr, rollout/logprob_diff_* (engine vs trainer), UpdateStats.metrics()
        + CriticStats.metrics()  critic/* (PPO: value loss, explained variance, ...)
        + throughput_metrics  perf/*_tokens_per_s
        + timing_metrics      perf/{sync,rollout,logprobs,update}_s, perf/step_time_s

Every number is over the whole step (every data-parallel rank's share), so one process and
N ranks log the same values for the same questions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from memrl.distributed import Dist, note
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.trainer.critic import CriticStats
from memrl.rl.trainer.rollout import informative_groups
from memrl.rl.trainer.update_log import UpdateStats

HEARTBEAT_PHASES = {"sync": "weight sync", "rollout": "rollout", "logprobs": "log-probs",
                    "update": "update", "metrics": "metrics"}
"""A step's phases, as the heartbeat names them (`memrl.distributed.note`)."""
TIMED = ("sync", "rollout", "logprobs", "update")
"""The phases logged as `perf/{phase}_s`."""


class Phases:
    """The phases of step `step`: each is announced to the heartbeat and timed.

    `with phases("rollout"): ...` records the block's wall-clock seconds in
    `phases.seconds["rollout"]`; `phases.elapsed()` is the time since the step began."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        note(HEARTBEAT_PHASES[phase], self.step)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = time.perf_counter() - t0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


@dataclass
class StepView:
    """What the step's metrics are computed from: per trajectory (in the order one process
    would hold them) and per conversation, gathered from every data-parallel rank."""

    trajectories: list[Any]
    """The step's trajectories without their turns (summaries only need scores and info)."""
    task_rewards: Any
    rewards: Any
    advantages: Any
    conversation_lengths: list[tuple[str, int]]
    """(turn kind, response tokens) of every conversation."""
    truncated: list[bool]
    response_tokens: float
    train_tokens: float

    @classmethod
    def of(cls, trajectories: list[Any], batch: RolloutBatch, task_rewards: Any) -> StepView:
        return cls(
            [dataclasses.replace(t, turns=[]) for t in trajectories],
            task_rewards, batch.rewards, batch.advantages,
            [(s.turn_kind, len(s.response_ids)) for s in batch.conversations],
            [s.truncated for s in batch.conversations],
            float(batch.response_tokens.sum()),
            float(sum(s.num_tokens for s in batch.conversations)),
        )

    def gathered(self, dist: Dist, group_order: list[str]) -> StepView:
        """Every rank's view in one, trajectories in `group_order` (as on one process)."""
        if dist.world_size == 1:
            return self
        import torch

        parts = dist.all_gather(self)
        rows = [(t, p.task_rewards[i], p.rewards[i], p.advantages[i])
                for p in parts for i, t in enumerate(p.trajectories)]
        where = {g: i for i, g in enumerate(group_order)}
        rows.sort(key=lambda r: (where[r[0].record_id], r[0].sample_index))
        column = lambda k: torch.stack([r[k] for r in rows])  # noqa: E731
        return StepView(
            [r[0] for r in rows], column(1), column(2), column(3),
            [x for p in parts for x in p.conversation_lengths],
            [x for p in parts for x in p.truncated],
            sum(p.response_tokens for p in parts),
            sum(p.train_tokens for p in parts),
        )


def data_metrics(view: StepView, task: Any, groups_generated: int) -> dict[str, float]:
    """`train/*`: task rewards, the task's own summary, groups (kept, informative,
    generated), samples and response lengths by turn kind, truncation, advantages and the
    KL penalty taken from the rewards."""
    trajs = view.trajectories
    lengths: dict[str, list[int]] = {}
    for kind, n in view.conversation_lengths:
        lengths.setdefault(kind, []).append(n)
    return {
        "train/reward_mean": float(view.task_rewards.mean()),
        "train/reward_std": float(view.task_rewards.std(unbiased=False)),
        **{f"train/{k}": v for k, v in task.summarize(trajs).items()},
        "train/groups": float(len({t.record_id for t in trajs})),
        "train/informative_groups": float(informative_groups(trajs)),
        "train/groups_generated": float(groups_generated),
        "train/samples": float(len(view.conversation_lengths)),
        **{f"train/{k}_response_len": float(np.mean(v)) for k, v in lengths.items()},
        "train/truncated_frac": float(np.mean(view.truncated)),
        "train/advantage_abs_mean": float(view.advantages.abs().mean()),
        "train/kl_reward_penalty": float((view.task_rewards - view.rewards).mean()),
    }


def throughput_metrics(view: StepView, seconds: dict[str, float], ppo_epochs: int
                       ) -> dict[str, float]:
    """Generated tokens per second of rollout; trained tokens (prompt + response, every PPO
    epoch) per second of update."""
    return {
        "perf/rollout_tokens_per_s": view.response_tokens / max(seconds["rollout"], 1e-9),
        "perf/train_tokens_per_s": view.train_tokens * ppo_epochs / max(seconds["update"], 1e-9),
    }


def timing_metrics(phases: Phases) -> dict[str, float]:
    """Seconds of each timed phase, and of the whole step until now."""
    return {**{f"perf/{p}_s": phases.seconds[p] for p in TIMED},
            "perf/step_time_s": phases.elapsed()}


def step_metrics(
    view: StepView, task: Any, phases: Phases, *, groups_generated: int, lr: float,
    mismatch: dict[str, float], update: UpdateStats, ppo_epochs: int,
    critic: CriticStats | None = None,
) -> dict[str, float]:
    """The step's line of metrics.jsonl (the step time is measured last)."""
    return {
        **data_metrics(view, task, groups_generated),
        "train/lr": lr,
        **mismatch,
        **update.metrics(),
        **(critic.metrics() if critic is not None else {}),
        **throughput_metrics(view, phases.seconds, ppo_epochs),
        **timing_metrics(phases),
    }

"""A task's reward: a weighted sum of named reward functions (TRL's `reward_funcs` and
`reward_weights`), each part kept in the trajectory's metrics as `reward/<name>` (logged as
`train/reward/<name>` and `val/reward/<name>`).

`rl.reward` chooses the parts: a name (weight 1), a mapping `{name: weight}`, or null (the
task's first reward). A reward function reads a scored trajectory and its record.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memrl.errors import MemrlInputError

RewardFunction = Callable[[Any, Any], float]
"""(scored trajectory, its record) → reward."""

PREFIX = "reward/"


def reward_of(config: Any) -> str | Mapping[str, float] | None:
    """The reward a config asks for: `config.rl.reward`, or None where the config has no
    `rl` section (the warm start's): the task's first reward."""
    rl = getattr(config, "rl", None)
    return getattr(rl, "reward", None)


def reward_weights(spec: str | Mapping[str, float] | None, offered: Sequence[str], *,
                   agent: str = "the task", location: str = "rl.reward") -> dict[str, float]:
    """{name: weight} of `spec` (see the module docstring); every name must be `offered`."""
    if spec is None:
        if not offered:
            raise MemrlInputError(f"{agent} offers no reward", location=location)
        return {offered[0]: 1.0}
    weights = {spec: 1.0} if isinstance(spec, str) else dict(spec)
    if not weights:
        raise MemrlInputError("give at least one reward", location=location)
    for name, weight in weights.items():
        if name not in offered:
            raise MemrlInputError(
                f"reward {name!r} has no meaning for agent {agent}; choose from "
                f"{', '.join(offered)}", location=location)
        if not isinstance(weight, int | float) or isinstance(weight, bool) \
                or not math.isfinite(weight):
            raise MemrlInputError(f"the weight of {name!r} must be a finite number, got "
                                  f"{weight!r}", location=f"{location}.{name}")
    return {name: float(w) for name, w in weights.items()}


def weighted_rewards(trajectories: Sequence[Any], records: Mapping[str, Any],
                     functions: Mapping[str, RewardFunction],
                     weights: Mapping[str, float]) -> list[Any]:
    """Copies of `trajectories` whose `reward` is Σ weight · function(trajectory, record)
    and whose metrics hold each part as `reward/<name>` (records keyed by record id)."""
    out = []
    for t in trajectories:
        record = records[t.record_id]
        parts = {name: float(functions[name](t, record)) for name in weights}
        total = sum(weights[name] * value for name, value in parts.items())
        metrics = {**t.metrics, **{PREFIX + name: v for name, v in parts.items()}}
        out.append(dataclasses.replace(t, reward=total, metrics=metrics))
    return out


def reward_means(trajectories: Sequence[Any]) -> dict[str, float]:
    """Mean of every `reward/<name>` part over the trajectories that have it."""
    sums: dict[str, list[float]] = {}
    for t in trajectories:
        for key, value in t.metrics.items():
            if key.startswith(PREFIX):
                sums.setdefault(key, []).append(value)
    return {key: sum(v) / len(v) for key, v in sums.items()}

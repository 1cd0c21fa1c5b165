"""Tasks: an agent workflow + its data + its reward, behind one base class (`Task`, which
owns the rollout: sampling, seeding, scheduling, weighted rewards; docs/agents.md).

Every task is built the same way, from the training config: `build_task(config)` finds the
Task class that `config.agent` names and calls its `from_config(config)`. `config.agent` is
a registered name (`TASKS`) or an import path `package.module:Class`, so an agent written
outside memrl trains and evaluates with no edit to memrl:

    agent: mypkg.agents:ToyTask     # the class; its `name` keys its config section
    toy:                            # validated by ToyTask.config_class
      max_new_tokens: 8
"""

from __future__ import annotations

import importlib
from typing import Any

from memrl.errors import MemrlInputError
from memrl.inference.schedule import EpisodeModel, ProgressEvent
from memrl.tasks.base import CanReplay, HasOracle, RendersRows, RolloutSpec, Sampling, Task
from memrl.tasks.rewards import RewardFunction, reward_of, reward_weights, weighted_rewards

TASKS: dict[str, str] = {
    "memagent": "memrl.tasks.memagent_qa:MemAgentQATask",
    "memupdate": "memrl.tasks.memupdate_locomo:MemoryUpdateTask",
}
"""Agent name → "module:Class" of its Task (imported on first use). A new agent = its agent
module, its task module, one line here (or none: name it by import path)."""

REQUIRED = ("name", "config_class", "rewards", "from_config", "load", "rollout", "summarize",
            "log_row")
"""What a class must have to be a Task (`memrl.tasks.base.Task` documents each)."""


def task_class(agent: str, location: str = "agent") -> type:
    """The Task class that `agent` names: a key of `TASKS`, or `package.module:Class`."""
    path = TASKS.get(agent)
    if path is None and ":" not in agent:
        raise MemrlInputError(
            f"unknown agent {agent!r}; known: {', '.join(TASKS)}, or an import path "
            "package.module:Class", location=location)
    module_name, _, name = (path or agent).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MemrlInputError(f"cannot import {module_name!r} for agent {agent!r} ({exc})",
                              location=location) from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise MemrlInputError(f"{module_name} has no class {name!r}", location=location)
    missing = [attr for attr in REQUIRED if not hasattr(cls, attr)]
    if missing:
        raise MemrlInputError(
            f"{agent} is not a memrl Task: it lacks {', '.join(missing)} "
            "(see memrl.tasks.base.Task)", location=location)
    if not isinstance(cls.name, str) or not cls.name.isidentifier():
        raise MemrlInputError(f"{agent}.name must be an identifier (its config section's "
                              f"key), got {cls.name!r}", location=location)
    return cls


def build_task(config: Any) -> Task:
    """The Task named by `config.agent`, configured from the config."""
    return task_class(config.agent).from_config(config)


__all__ = ["TASKS", "CanReplay", "EpisodeModel", "HasOracle", "ProgressEvent", "RendersRows",
           "RewardFunction", "RolloutSpec", "Sampling", "Task", "build_task", "reward_of",
           "reward_weights", "task_class", "weighted_rewards"]

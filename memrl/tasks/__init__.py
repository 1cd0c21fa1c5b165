"""Tasks: an agent workflow + its data + its reward, behind one interface.

Every task is built the same way, from the training config: `build_task(config)` looks up
`config.agent` in `TASKS` and calls the class's `from_config(config)`.
"""

from __future__ import annotations

import importlib
from typing import Any

from memrl.errors import MemrlInputError
from memrl.tasks.base import Task

TASKS: dict[str, str] = {
    "memagent": "memrl.tasks.memagent_qa:MemAgentQATask",
    "memupdate": "memrl.tasks.memupdate_locomo:MemoryUpdateTask",
}
"""Agent name → "module:class" of its Task (imported on first use)."""


def task_class(agent: str) -> type:
    """The Task class registered for `agent`."""
    if agent not in TASKS:
        raise MemrlInputError(
            f"unknown agent {agent!r}; known: {', '.join(TASKS)}", location="agent"
        )
    module, _, name = TASKS[agent].partition(":")
    return getattr(importlib.import_module(module), name)


def build_task(config: Any) -> Task:
    """The Task named by `config.agent`, configured from the config."""
    return task_class(config.agent).from_config(config)


__all__ = ["TASKS", "Task", "build_task", "task_class"]

"""Tasks: an agent workflow + its data + its reward, behind one interface for the trainer."""

from __future__ import annotations

from typing import Any

from memrl.tasks.base import Task


def build_task(config: Any) -> Task:
    """The Task named by `config.agent`, configured from the matching config section."""
    if config.agent == "memagent":
        from memrl.tasks.memagent_qa import MemAgentQATask

        return MemAgentQATask(config.memagent, reward=config.rl.reward)
    if config.agent == "memupdate":
        from memrl.tasks.memupdate_locomo import MemoryUpdateTask

        return MemoryUpdateTask.from_config(config)
    raise ValueError(f"unknown agent {config.agent!r}")


__all__ = ["Task", "build_task"]

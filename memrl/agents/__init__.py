"""Agent workflows: one record in, one Trajectory out. Agents never import `memrl.rl`."""

from memrl.agents.memagent import (
    ChunkSource,
    ContextChunks,
    MemAgent,
    MemAgentConfig,
    ProgressEvent,
    chunk_context,
    rich_progress_callback,
    split_token_ids,
)
from memrl.agents.prompts import PROMPT_PRESETS, MemAgentPrompts, resolve_prompts
from memrl.agents.trajectory import Trajectory, Turn

__all__ = [
    "PROMPT_PRESETS",
    "ChunkSource",
    "ContextChunks",
    "MemAgent",
    "MemAgentConfig",
    "MemAgentPrompts",
    "ProgressEvent",
    "Trajectory",
    "Turn",
    "chunk_context",
    "resolve_prompts",
    "rich_progress_callback",
    "split_token_ids",
]

"""Agent workflows: one record in, one `memrl.trajectory.Trajectory` out. Agents never
import `memrl.rl`."""

from memrl.agents.memagent import (
    ChunkSource,
    ContextChunks,
    MemAgent,
    MemAgentConfig,
    MemAgentDetails,
    MemAgentTurn,
    ProgressEvent,
    chunk_context,
    rich_progress_callback,
    split_token_ids,
)
from memrl.agents.prompts import PROMPT_PRESETS, MemAgentPrompts, resolve_prompts

__all__ = [
    "PROMPT_PRESETS",
    "ChunkSource",
    "ContextChunks",
    "MemAgent",
    "MemAgentConfig",
    "MemAgentDetails",
    "MemAgentPrompts",
    "MemAgentTurn",
    "ProgressEvent",
    "chunk_context",
    "resolve_prompts",
    "rich_progress_callback",
    "split_token_ids",
]

"""The contract between agents and training: a Trajectory of Turns.

An agent turns one record into a Trajectory; `memrl.rl` only ever sees these fields, never
which agent produced them. Every Turn is one independent conversation (one prompt, one
model response) and becomes one training sample carrying the trajectory's advantage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Turn:
    """One model call: the exact prompt tokens and the sampled response tokens."""

    kind: str
    """What the turn does, e.g. "memory_update", "final", "tool"."""
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    """Log-probability of each response token under the generator's sampling policy."""
    response_text: str
    finish_reason: str = "stop"
    """"stop" (EOS or stop string) or "length" (cut at max_new_tokens)."""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.response_logprobs):
            raise ValueError(
                f"turn has {len(self.response_ids)} response tokens but "
                f"{len(self.response_logprobs)} logprobs"
            )

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class Trajectory:
    """Everything one episode produced, plus the single scalar reward it earned."""

    record_id: str
    """Id of the question; trajectories with the same record_id form a GRPO group."""
    sample_index: int = 0
    """Which of the group's samples this is (0..n-1)."""
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None
    """The extracted final answer (e.g. the last \\boxed{} content), None if malformed."""
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    """Agent-specific bookkeeping for logs (memory after each chunk, tool stats, ...)."""

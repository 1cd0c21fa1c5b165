"""The contract between agents, tasks and training: a Trajectory of Turns.

An agent turns one record into a Trajectory; a task scores it and returns a scored copy;
`memrl.rl` only ever sees these fields, never which agent produced them. Every Turn is one
independent conversation (one prompt, one model response) and becomes one training sample
carrying the trajectory's advantage.

Both are frozen: nobody patches a trajectory in place. A task returns scored copies
(`dataclasses.replace(trajectory, answer=..., reward=..., metrics=..., scoring=...)`).
What is particular to an agent or a task is a small typed dataclass of that agent or task
(`details`, `Turn.detail`, `scoring`); this module imports nothing of memrl, so agents,
tasks and `rl` may all depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Turn:
    """One model call: the exact prompt tokens and the sampled response tokens."""

    kind: str
    """What the turn does, e.g. "memory_update", "final", "tool"."""
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    response_logprobs: Sequence[float]
    """Log-probability of each response token under the generator's sampling policy."""
    response_text: str
    finish_reason: str = "stop"
    """"stop" (EOS or stop string) or "length" (cut at max_new_tokens)."""
    prompt_tokens: int = -1
    """Tokens of the prompt; -1 (the default) means len(prompt_ids). Set it when the ids
    are not kept (evaluation over long contexts keeps only the counts)."""
    response_tokens: int = -1
    """Tokens of the response; -1 (the default) means len(response_ids)."""
    detail: Any = None
    """What the agent knows of this turn (a typed dataclass of the agent, e.g.
    `memrl.agents.memagent.MemAgentTurn`), or None."""

    def __post_init__(self) -> None:
        if len(self.response_ids) != len(self.response_logprobs):
            raise ValueError(
                f"turn has {len(self.response_ids)} response tokens but "
                f"{len(self.response_logprobs)} logprobs"
            )
        if self.prompt_tokens < 0:
            object.__setattr__(self, "prompt_tokens", len(self.prompt_ids))
        if self.response_tokens < 0:
            object.__setattr__(self, "response_tokens", len(self.response_ids))

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass(frozen=True)
class Trajectory:
    """Everything one episode produced, plus the single scalar reward it earned."""

    record_id: str
    """Id of the question; trajectories with the same record_id form a GRPO group."""
    sample_index: int = 0
    """Which of the group's samples this is (0..n-1)."""
    turns: tuple[Turn, ...] = ()
    """The model calls in order (any sequence given is kept as a tuple)."""
    answer: str | None = None
    """The extracted final answer (e.g. the last \\boxed{} content), None if malformed."""
    reward: float | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Per-trajectory scores (em, f1, score_final, ...), set by the task."""
    details: Any = None
    """What the agent kept of the episode (a typed dataclass of the agent, e.g.
    `memrl.agents.memagent.MemAgentDetails`: memory after each chunk, tool statistics)."""
    scoring: Any = None
    """What the task found while scoring (a typed dataclass of the task, e.g. where the
    evidence entered, what changed in memory), or None."""

    def __post_init__(self) -> None:
        if not isinstance(self.turns, tuple):
            object.__setattr__(self, "turns", tuple(self.turns))


def generated_turn(kind: str, prompt: Sequence[int], generation: Any, *, keep_ids: bool = True,
                   detail: Any = None) -> Turn:
    """The Turn of one model call: `prompt` and the engine's `generation` (token ids,
    logprobs, text, finish reason). `keep_ids=False` keeps only the token counts
    (evaluation does not train)."""
    return Turn(
        kind=kind,
        prompt_ids=list(prompt) if keep_ids else [],
        response_ids=list(generation.token_ids) if keep_ids else [],
        response_logprobs=list(generation.logprobs) if keep_ids else [],
        response_text=generation.text,
        finish_reason=generation.finish_reason,
        prompt_tokens=len(prompt),
        response_tokens=len(generation.token_ids),
        detail=detail,
    )

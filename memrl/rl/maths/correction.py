"""Training–inference mismatch: how far the engine's log-probs are from the trainer's, and the
truncated importance-sampling (TIS) correction of the policy gradient.

An inference engine (vLLM: other kernels, other precision) samples from π_rollout, which is
close to, but not exactly, the trainer's π_old with the same weights. The samples are then
slightly off-policy; Yao et al., "Your efficient RL framework secretly brings you off-policy
RL training" (2025), and verl's rollout correction weigh each token's policy-gradient loss by

    token level:     w_t = min(π_old(y_t) / π_rollout(y_t), C)
    sequence level:  w   = min(Π_t π_old(y_t) / π_rollout(y_t), C)   (one per conversation)

(the log-ratio is clamped to [-20, log C] before exp, as verl's). The weights are constants
(no gradient). With old log-probs taken from the engine (no recompute pass) the ratio is 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from memrl.errors import InfrastructureError, MemrlInputError

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "LogprobGuard",
    "RolloutMismatchError",
    "check_logprob_mismatch",
    "logprob_mismatch",
    "rollout_is_weights",
]

ROLLOUT_IS_LEVELS = ("token", "sequence")
"""verl's `rollout_is` levels."""


class Gatherer(Protocol):
    """What `LogprobGuard.check` needs of the process group (`memrl.distributed.Dist`): every
    rank's value, in rank order."""

    def all_gather(self, value: float) -> list[float]: ...


def logprob_mismatch(engine: Sequence[Tensor], trainer: Sequence[Tensor]) -> dict[str, float]:
    """Mean and max |engine − trainer| log-prob over every response token of every sample."""
    if len(engine) != len(trainer):
        raise ValueError(f"{len(engine)} engine rows for {len(trainer)} trainer rows")
    diffs = [
        (a.to(torch.float64) - b.to(torch.float64)).abs().flatten()
        for a, b in zip(engine, trainer, strict=True)
    ]
    flat = torch.cat(diffs) if diffs else torch.zeros(0, dtype=torch.float64)
    if flat.numel() == 0:
        return {"mean": 0.0, "max": 0.0}
    return {"mean": float(flat.mean()), "max": float(flat.max())}


class RolloutMismatchError(InfrastructureError):
    """The rollout engine's log-probs are further from the trainer's than the run allows."""


def check_logprob_mismatch(worst: float, limit: float | None, *, engine: str, step: int) -> None:
    """Raise RolloutMismatchError, one line naming `engine`, `step` and the value, when the
    largest |engine − trainer| log-prob `worst` exceeds `limit` (NaN does too); None: no
    check."""
    if limit is None or worst <= limit:
        return
    raise RolloutMismatchError(
        f"rollout engine {engine}: log-probs differ from the trainer's by up to {worst:.4g} "
        f"at step {step}, above rollout.max_logprob_diff={limit:g}: the engine does not "
        "sample the policy being trained (stale weights? servers started without "
        "--logprobs-mode processed_logprobs?); the step's update was not applied"
    )


@dataclass(frozen=True)
class LogprobGuard:
    """The engine's log-probs of a step's responses (per conversation of this rank) and the
    bound on their distance to the trainer's old log-probs (rollout.max_logprob_diff)."""

    engine_logprobs: Sequence[Tensor]
    limit: float | None
    """None: measure, never stop."""
    engine: str
    step: int

    def check(self, trainer_logprobs: Sequence[Tensor], dist: Gatherer) -> dict[str, float]:
        """`rollout/logprob_diff_mean` (this rank's tokens) and `rollout/logprob_diff_max`
        (every rank's: all ranks stop, or none); raises RolloutMismatchError past the limit.
        A collective: every rank calls it once."""
        diff = logprob_mismatch(self.engine_logprobs, trainer_logprobs)
        worst = max(dist.all_gather(diff["max"]))
        check_logprob_mismatch(worst, self.limit, engine=self.engine, step=self.step)
        return {"rollout/logprob_diff_mean": diff["mean"], "rollout/logprob_diff_max": worst}


def rollout_is_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str,
    threshold: float,
) -> Tensor:
    """Truncated IS weights (B, L) of the module docstring; 0 where `mask` is off.

    `old_logprobs`, `rollout_logprobs`: (B, L) log-probs of the same tokens under the
    trainer's π_old and the engine's π_rollout; `mask` (B, L) the tokens that count (one row
    is one sequence); `threshold` the cap C > 0.
    """
    if level not in ROLLOUT_IS_LEVELS:
        raise MemrlInputError(
            f"rollout_is must be one of {', '.join(ROLLOUT_IS_LEVELS)}, got {level!r}",
            location="rl.rollout_is",
        )
    if not threshold > 0:
        raise MemrlInputError(f"must be > 0, got {threshold}", location="rl.rollout_is_threshold")
    if old_logprobs.shape != rollout_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError("old_logprobs, rollout_logprobs and mask must have the same shape")
    m = mask.to(torch.bool)
    log_ratio = torch.where(
        m, old_logprobs.detach().float() - rollout_logprobs.detach().float(), 0.0
    )
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    weights = torch.exp(log_ratio.clamp(min=-20.0, max=math.log(threshold)))
    return torch.where(m, weights, 0.0)

"""The optimizer side of training, shared by every recipe (GRPO's actor and the SFT warm
start): AdamW over the trainable parameters, verl's learning-rate schedules, and one
optimizer step.

    grad_norm = optimizer_step(model, optimizer, grad_clip, scheduler=...)
        clip the gradients' global norm; step unless that norm is NaN/inf (the step is
        skipped, as verl skips it); clear the gradients; step the schedule if given
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["build_optimizer", "optimizer_step", "warmup_schedule"]


def build_optimizer(model: torch.nn.Module, *, lr: float, betas, weight_decay: float):
    """AdamW over the trainable parameters (all of them, or the LoRA adapters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)


# verl `get_constant_schedule_with_warmup`: the lr multiplier of optimizer step s (0-based)
# is s / W while s < W, then 1; so with W = 3 steps the first steps use lr x 0, 1/3, 2/3, 1.
def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, *,
                    kind: str = "constant", total_steps: int | None = None,
                    min_lr_ratio: float = 0.0):
    """The learning-rate schedule, stepped once per training step, as verl's.

    "constant": linear warmup over `warmup_steps` (step s uses lr · s / W), then lr.
    "cosine" (verl get_cosine_schedule_with_warmup, half a cycle): warmup from
    lr · min_lr_ratio to lr, then lr · max(m, (1 + m)/2 + (1 - m)/2 · cos(π · p)) with m the
    min_lr_ratio and p = (s - W) / (total_steps - W), reaching lr · m at total_steps and
    staying there (verl's would rise again past total_steps).
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    w, m = warmup_steps, min_lr_ratio
    if kind == "constant":
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: float(s) / float(max(1, w)) if s < w else 1.0
        )
    if kind != "cosine":
        raise ValueError(f"unknown lr schedule {kind!r}: constant or cosine")
    if total_steps is None or total_steps < 1:
        raise ValueError(f"the cosine schedule needs total_steps >= 1, got {total_steps}")
    if not 0.0 <= m <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {m}")

    def cosine(s: int) -> float:
        if s < w:
            return m + (1.0 - m) * float(s) / float(max(1, w))
        progress = min(1.0, float(s - w) / float(max(1, total_steps - w)))
        return max(m, (1.0 + m) / 2 + (1.0 - m) / 2 * math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float, *,
    scheduler: Any = None, extra_params: Sequence[torch.Tensor] = (),
) -> float:
    """Clip the gradients of the model's trainable parameters (and of `extra_params`, e.g.
    a value head on the policy) to global norm `grad_clip`, step the optimizer unless that
    norm is not finite, clear the gradients, then step `scheduler` (when given).

    The parameters are read from the model here, at the step: an FSDP model registers its
    sharded parameters (those holding the gradients) again only after backward. Returns the
    norm before clipping; with FSDP (a DTensor) the norm over every shard."""
    params = [p for p in model.parameters() if p.requires_grad] + list(extra_params)
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if hasattr(norm, "full_tensor"):  # FSDP: a DTensor, reduced over the shards
        norm = norm.full_tensor()
    grad_norm = float(norm)
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return grad_norm

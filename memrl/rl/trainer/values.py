"""What PPO's two kinds of critic share (`critic.value_model`): the linear value head, and
what a critic's update reports.

    head = value_head(hidden_size, device=..., dtype=...)    Linear(H, 1), OpenRLHF's init
    v    = head_values(head, hidden)                          (..., H) → (...) values
    PolicyValueHead(model=head, vf_coef=..., cliprange_value=...)
        a head on the policy (critic.value_model: policy_head), trained by the actor's
        update (`memrl.rl.trainer.actor`): one backward of pg_loss + vf_coef · vf_loss
    CriticStats                                               the `critic/*` metrics

The separate value model (critic.value_model: separate) is `memrl.rl.trainer.critic.ValueModel`: a
transformer body of its own under the same head.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from memrl.rl.maths.gae import value_statistics

if TYPE_CHECKING:
    from memrl.rl.maths.batch import RolloutBatch

__all__ = ["CriticStats", "PolicyValueHead", "batch_value_statistics", "head_values",
           "value_head"]


def value_head(hidden_size: int, *, device: Any = None, dtype: torch.dtype | None = None
               ) -> nn.Linear:
    """A fresh linear value head: one value per position from a hidden state."""
    # Built and drawn on the CPU whatever the device, so one seed gives the same head on CPU
    # and GPU, replicated or sharded (a sharded critic is built on the CPU, a replicated one
    # on its GPU). OpenRLHF's value-head init: std 1/(H+1), so initial values are
    # O(1/sqrt(H)), whatever the body's initializer_range.
    head = nn.Linear(hidden_size, 1)
    nn.init.normal_(head.weight, std=1.0 / (hidden_size + 1))
    nn.init.zeros_(head.bias)
    head = head.to(device=device, dtype=dtype)
    return head


def head_values(head: nn.Module, hidden: Tensor) -> Tensor:
    """The values of hidden states (..., H) → (...), computed in the head's dtype."""
    return head(hidden.to(head.weight.dtype)).squeeze(-1)


@dataclass
class PolicyValueHead:
    """A value head on the policy's last hidden state (critic.value_model: policy_head), as
    OpenAI baselines' shared-body PPO and TRL's AutoModelForCausalLMWithValueHead: the
    actor's update takes one backward of pg_loss + vf_coef · vf_loss through the shared
    body. Its parameters are a parameter group of the actor's AdamW (critic.optim's lr and
    weight decay), so it has no optimizer or schedule of its own: a checkpoint keeps its
    weights in `critic/` and its AdamW state with the policy's."""

    model: nn.Linear
    vf_coef: float
    """Weight of the value loss in the joint loss (critic.vf_coef)."""
    cliprange_value: float
    """Clip of the new values around the rollout's (critic.cliprange_value)."""
    optimizer: ClassVar[None] = None
    scheduler: ClassVar[None] = None

    def parameters(self) -> list[Tensor]:
        return list(self.model.parameters())


@dataclass(frozen=True, kw_only=True)
class CriticStats:
    """What one critic update measured (logged as `critic/<name>`), over every rank's share
    of the step: the loss and grad norm are means over its optimizer steps (the loss of a
    step is the whole mini-batch's), the clip fraction and vpred_mean over every loss token
    of the update; values, returns and the explained variance are over the batch's loss
    tokens before the update (verl's metric_utils). A value head on the policy: grad_norm
    is the head's (the shared body's, the value loss's share included, is actor/grad_norm)."""

    vf_loss: float
    vf_clipfrac: float
    vpred_mean: float
    """Mean value the critic predicted during the update."""
    grad_norm: float
    lr: float
    """The critic's learning rate of this update."""
    values_mean: float
    returns_mean: float
    vf_explained_var: float

    def metrics(self) -> dict[str, float]:
        return {f"critic/{f.name}": getattr(self, f.name) for f in fields(self)}


def batch_value_statistics(batch: RolloutBatch, *, all_reduce_sum: Any = None
                           ) -> dict[str, float]:
    """Values, returns and explained variance over the response tokens of the trainable
    conversations of every rank's share of the batch (`value_statistics`)."""
    keep = [i for i, s in enumerate(batch.conversations) if s.trainable]
    if batch.values is None or batch.returns is None:
        raise ValueError("the critic's statistics need values and returns in the batch")
    values = torch.cat([batch.values[i] for i in keep] or [torch.zeros(0)])
    returns = torch.cat([batch.returns[i] for i in keep] or [torch.zeros(0)])
    ones = torch.ones_like(values, dtype=torch.bool)
    return value_statistics(returns, values, ones, all_reduce_sum=all_reduce_sum)

"""The value model of PPO (`rl.adv_estimator: gae`) and its training.

    critic.values(batch)   V(s_t) at every response token of every sample (no grad)
    critic.update(batch, dist)
                           rl.ppo_epochs × mini-batches (rl.ppo_mini_batch_size questions)
                           × micro-batches, one optimizer step per mini-batch, on the
                           clipped value loss against the batch's GAE returns

`ValueModel` is a separate model: a causal LM's transformer body (its decoder, without the
vocabulary projection) and a linear head giving one value per position, as verl's critic
(`AutoModelForTokenClassification` with one label) and TRL's value model. Values are read at
the positions the batch puts per-token numbers (`memrl.rl.maths.batch.collate`: the logit
position that predicts the token), so V(s_t) is the value of the context before response
token t. The loss is aggregated with the actor's `rl.loss_agg_mode` and `LossNorm`, so it
is exact however a mini-batch is cut into micro-batches (verl rescales per micro-batch).

Data parallelism (as the actor, `memrl.rl.trainer.actor`): every rank holds its own share of the
step's trajectories and walks the same global mini-batches (`RolloutBatch.group_order`; its
share of one may be empty); the loss divisors are counts added over ranks
(`LossNorm.with_global_count`), so a rank's loss is its exact share of the mini-batch loss,
and the gradients are summed over ranks before clipping and AdamW: N ranks take the update
one process takes on the whole batch. Replicated (model.strategy replicate), every rank
holds a whole copy of the value model and its AdamW state, and `Dist.sum_gradients` sums
the gradients. Sharded (model.strategy fsdp: `memrl.rl.trainer.sharding.shard`, the policy's mesh
and mixed precision), every rank holds 1/N of each weight and of its AdamW state, FSDP's
reduce-scatter sums the gradients, and every rank runs as many forwards and backwards as
the busiest (zero-weight padding micro-batches: its forwards are collectives). The logged
statistics are over every rank's tokens.

A value head sharing the policy's body (critic.value_model: policy_head) is not this class:
the actor trains it (`memrl.rl.trainer.values.PolicyValueHead`). Not here: padding-free (packed)
micro-batches (docs/algorithms.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from memrl.distributed import Dist
from memrl.rl.config import RLConfig
from memrl.rl.maths.batch import RolloutBatch, on_device, pack_token_budget, response_rows
from memrl.rl.maths.gae import value_loss
from memrl.rl.maths.losses import agg_loss, masked_mean
from memrl.rl.trainer.actor import mixed_precision
from memrl.rl.trainer.optim import optimizer_step
from memrl.rl.trainer.sharding import padding_micro_batch, padding_passes
from memrl.rl.trainer.values import CriticStats, batch_value_statistics, head_values, value_head

__all__ = ["Critic", "CriticStats", "ValueModel"]


class ValueModel(nn.Module):
    """A transformer body and a linear head: one value per position, (batch, seq)."""

    def __init__(self, body: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        param = next(body.parameters())
        self.head = value_head(hidden_size, device=param.device, dtype=param.dtype)
        # the body's repeated blocks: FSDP shards each as a unit (`sharding.decoder_layers`)
        self._no_split_modules = list(getattr(body, "_no_split_modules", None) or [])

    @classmethod
    def from_causal_lm(cls, lm: Any) -> ValueModel:
        """The body of a Hugging Face causal LM (its vocabulary projection dropped)."""
        body = lm.get_decoder() if hasattr(lm, "get_decoder") else None
        if body is None or body is lm:
            raise ValueError(f"{type(lm).__name__} has no separate decoder to read values from")
        return cls(body, int(lm.config.hidden_size))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None) -> Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, use_cache=False).last_hidden_state
        # not a view (squeeze's): FSDP hooks its backward on the root module's output
        return head_values(self.head, hidden).clone()


@dataclass
class Critic:
    """The value model, its optimizer and lr schedule, and its micro-batching."""

    model: ValueModel
    config: RLConfig
    """rl: use_dynamic_bsz, ppo_epochs, ppo_mini_batch_size, loss_agg_mode."""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    grad_clip: float
    cliprange_value: float
    pad_id: int
    max_tokens_per_micro_batch: int
    micro_batch_size: int
    autocast_dtype: torch.dtype | None = None
    """bf16 autocast on CUDA (model.dtype auto), else None."""
    sharded_over: Dist | None = None
    """The ranks an FSDP value model is sharded over (None: not sharded). Its forwards are
    collectives, so every rank runs as many as the busiest (zero-weight padding)."""
    compute_device: torch.device | None = None
    """Where forward passes run (None: the parameters' device; FSDP with CPU offload keeps
    the shards on the CPU)."""

    @property
    def device(self) -> torch.device:
        return self.compute_device or next(self.model.parameters()).device

    def autocast(self) -> contextlib.AbstractContextManager:
        return mixed_precision(self.autocast_dtype, self.device)

    def micro_batches(self, batch: RolloutBatch, indices: Sequence[int]) -> list[list[int]]:
        """Positions within `indices` of each micro-batch (token budget, padded rows, or a
        fixed size: rl.use_dynamic_bsz as the actor)."""
        if self.config.use_dynamic_bsz:
            sizes = [batch.conversations[i].num_tokens for i in indices]
            return pack_token_budget(sizes, self.max_tokens_per_micro_batch, padded=True)
        n, k = len(indices), self.micro_batch_size
        return [list(range(i, min(i + k, n))) for i in range(0, n, k)]

    def _forward(self, tensors: dict[str, Tensor]) -> Tensor:
        dev = self.device
        with self.autocast():
            inputs = on_device(tensors, ("input_ids", "attention_mask", "position_ids"), dev)
            out = self.model(inputs["input_ids"], inputs["attention_mask"],
                             inputs["position_ids"])
        return out.float()

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> list[Tensor]:
        """V(s_t) at every response token of every sample (float32, CPU), in eval mode."""
        was_training = self.model.training
        self.model.eval()
        out: list[Tensor] = [torch.empty(0)] * len(batch.conversations)
        everything = list(range(len(batch.conversations)))
        try:
            micros = self.micro_batches(batch, everything) if everything else []
            padding = padding_passes(self.sharded_over, len(micros))  # agreed before any forward
            for micro in micros:
                tensors = batch.collate(micro, self.pad_id)
                v = self._forward(tensors)
                for i, row in zip(micro, response_rows(v, tensors["response_mask"]), strict=True):
                    out[i] = row
            for _ in range(padding):
                self._forward(padding_micro_batch(self.pad_id))
        finally:
            self.model.train(was_training)
        return out

    def replicate(self, dist: Dist) -> None:
        """Every rank's copy of the value model set to the main rank's, as DDP does when it
        wraps a module: the fresh value head is a random draw, equal on every rank only as
        long as every rank drew the same numbers from the same seed before it. Sharded,
        nothing to do: every element of a weight lives on one rank (the head's one row on
        rank 0)."""
        if dist.world_size > 1 and self.sharded_over is None:
            dist.broadcast_(list(self.model.state_dict().values()))

    def update(self, batch: RolloutBatch, dist: Dist = Dist()) -> CriticStats:
        """PPO epochs over mini-batches of the clipped value loss; one optimizer step each;
        then one lr-schedule step. Needs the batch's values and returns.

        `dist`: the data-parallel ranks, each holding its share of the step (see the module
        docstring); every rank calls this, a rank with no conversation included."""
        cfg = self.config
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic's update needs values and returns in the batch")
        before = batch_value_statistics(batch, all_reduce_sum=dist.all_reduce_sum)
        lr = float(self.optimizer.param_groups[0]["lr"])
        params = [p for p in self.model.parameters() if p.requires_grad]
        # this rank's sums: loss shares, clipped and predicted values × tokens, tokens
        local = torch.zeros(4, dtype=torch.float64)
        grad_norms: list[float] = []
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            for mini in batch.mini_batches(cfg.ppo_mini_batch_size):
                norm = batch.loss_norm(mini, cfg.loss_agg_mode,
                                       scale_factor=cfg.loss_scale_factor)
                norm = norm.with_global_count(dist.all_reduce_sum)
                self.optimizer.zero_grad(set_to_none=True)
                micros = self.micro_batches(batch, mini) if mini else []
                # agreed before any forward
                padding = padding_passes(self.sharded_over, len(micros))
                for positions in micros:
                    tensors = batch.collate([mini[p] for p in positions], self.pad_id)
                    targets = on_device(tensors, ("loss_mask", "returns", "values"),
                                        self.device)  # queued before the forward
                    vpreds = self._forward(tensors)
                    mask = targets["loss_mask"]
                    mat, clipfrac = value_loss(vpreds, targets["returns"], targets["values"],
                                               mask, self.cliprange_value)
                    loss = agg_loss(mat, mask, cfg.loss_agg_mode, norm=norm.rows(positions))
                    loss.backward()
                    n = float(mask.sum())
                    local += torch.tensor([
                        float(loss.detach()), float(clipfrac) * n,
                        float(masked_mean(vpreds.detach(), mask)) * n, n,
                    ], dtype=torch.float64)
                for _ in range(padding):
                    # zero gradients, same collectives
                    (self._forward(padding_micro_batch(self.pad_id)).sum() * 0.0).backward()
                if self.sharded_over is None:  # FSDP's reduce-scatter already summed them
                    dist.sum_gradients(params)
                grad_norms.append(optimizer_step(self.model, self.optimizer, self.grad_clip))
        self.scheduler.step()
        loss_sum, clipped, vpred, tokens = dist.all_reduce_sum(local).tolist()
        steps = max(len(grad_norms), 1)
        return CriticStats(
            vf_loss=loss_sum / steps,
            # the same on every rank: the gradients were summed before the norm
            grad_norm=sum(g for g in grad_norms if math.isfinite(g)) / steps,
            vf_clipfrac=clipped / max(tokens, 1.0),
            vpred_mean=vpred / max(tokens, 1.0),
            lr=lr,
            **before,
        )

"""The policy being trained (`Actor`) and the frozen one it is kept near (`Reference`).

Both compute per-token log-probs of a `RolloutBatch`'s responses; the actor also runs the
PPO update. Neither knows which agent or engine produced the batch.

    actor.logprobs(batch)      old log-probs, no grad, eval mode
    actor.update(batch, dist)  ppo_epochs × mini-batches (ppo_mini_batch_size questions)
                               × token-budget micro-batches, one optimizer step per
                               mini-batch; the loss of every micro-batch is its exact share
                               of the mini-batch loss (`LossNorm`), so gradients do not
                               depend on how the mini-batch was split; a batch
                               without old log-probs (on-policy) takes them from the
                               update's own forward, detached (ratio 1: no separate pass)

The forward of both is `memrl.rl.trainer.logprobs.response_pass`: the final hidden states are
projected to the vocabulary only at response positions, fused with the log-prob for a plain
linear head; with a value head on the policy (critic.value_model: policy_head) the same
forward gives the values, and the actor's loss adds critic.vf_coef · vf_loss to the policy
loss (one backward through the shared body).

Padding: with rl.remove_padding each micro-batch runs as one packed row of its real tokens
(`memrl.rl.trainer.packing`), and token-budget micro-batches count real tokens; otherwise rows are
right-padded to the longest. `update` reports the padding waste, the tokens per micro-batch
and, given the accelerator's peak, the MFU (`memrl.rl.maths.flops`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from memrl.distributed import Dist
from memrl.models.attention import uses_varlen
from memrl.rl.config import RLConfig
from memrl.rl.maths.batch import RolloutBatch, on_device, pack_token_budget, response_rows
from memrl.rl.maths.correction import LogprobGuard, rollout_is_weights
from memrl.rl.maths.flops import ModelShape, train_flops
from memrl.rl.maths.gae import value_loss
from memrl.rl.maths.losses import LossNorm, agg_loss, kl_penalty, masked_mean, policy_loss
from memrl.rl.trainer.logprobs import (
    policy_hidden_states_error,
    response_logprobs,
    response_pass,
)
from memrl.rl.trainer.optim import build_optimizer, optimizer_step, warmup_schedule
from memrl.rl.trainer.packing import check_packed_attention
from memrl.rl.trainer.sharding import padding_micro_batch, padding_passes, run_as_forward
from memrl.rl.trainer.update_log import HeadBefore, LossTerms, OldPass, UpdateLog, UpdateStats
from memrl.rl.trainer.values import PolicyValueHead, batch_value_statistics

__all__ = ["Actor", "Reference", "build_optimizer",
           "policy_hidden_states_error", "response_logprobs", "response_pass",
           "warmup_schedule"]


def _grad_norm(params: Sequence[Tensor]) -> float:
    """The global norm of the parameters' gradients (None counts as zeros)."""
    grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def mixed_precision(dtype: torch.dtype | None, device: torch.device
                    ) -> contextlib.AbstractContextManager:
    """Autocast to `dtype` (bf16 over fp32 master weights) for a forward on a CUDA `device`;
    nothing for dtype None or another device. The one mixed-precision rule of the actor, the
    critic and `memrl sft`."""
    if dtype is None or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype)


class _PolicyModel:
    """Shared by Actor and Reference: micro-batching and no-grad log-probs of a batch."""

    def __init__(
        self,
        model: Any,
        config: RLConfig,
        *,
        pad_id: int,
        temperature: float = 1.0,
        autocast_dtype: torch.dtype | None = None,
        sharded_over: Dist | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.temperature = temperature if temperature > 0 else 1.0
        self.autocast_dtype = autocast_dtype
        self.sharded_over = sharded_over
        """The ranks an FSDP model is sharded over (None: not sharded). Its forwards are
        collectives, so every rank runs as many as the busiest (zero-weight padding)."""
        self.compute_device = device
        self.value_head: PolicyValueHead | None = None
        """The actor's value head on the policy (critic.value_model policy_head), else None."""
        self._packing_checked = False

    @property
    def device(self) -> torch.device:
        """Where forward passes run: the given device, else the parameters'."""
        return self.compute_device or next(self.model.parameters()).device

    @property
    def packed(self) -> bool:
        """Whether micro-batches run packed: rl.remove_padding, its `auto` resolved by the
        model's attention (packed with model.attn_implementation varlen)."""
        remove = self.config.remove_padding
        return uses_varlen(self.model) if remove == "auto" else remove

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast over fp32 master weights (CUDA), else nothing."""
        return mixed_precision(self.autocast_dtype, self.device)

    def micro_batches(self, batch: RolloutBatch, indices: Sequence[int]) -> list[list[int]]:
        """Positions within `indices` of each micro-batch (token budget or fixed size)."""
        cfg = self.config
        if cfg.use_dynamic_bsz:
            sizes = [batch.conversations[i].num_tokens for i in indices]
            return pack_token_budget(
                sizes, cfg.max_tokens_per_micro_batch, padded=not self.packed
            )
        n, k = len(indices), cfg.micro_batch_size
        return [list(range(i, min(i + k, n))) for i in range(0, n, k)]

    def _forward(self, tensors: dict[str, Tensor], *, with_values: bool = False, **kw: Any
                 ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Log-probs, entropies (with_entropy) and the value head's values (with_values)."""
        packed = self.packed
        if packed and not self._packing_checked:
            check_packed_attention(self.model)
            self._packing_checked = True
        head = self.value_head.model if with_values and self.value_head is not None else None
        with self.autocast():
            return run_as_forward(self.model, response_pass, self.model, tensors,
                                  temperature=self.temperature, device=self.device,
                                  remove_padding=packed, value_head=head, **kw)

    def logprobs(self, batch: RolloutBatch) -> list[Tensor]:
        """Log-prob of every conversation's response tokens (float32, CPU), in eval mode."""
        return self._per_token(batch, with_entropy=False)[0]

    def logprobs_and_entropy(self, batch: RolloutBatch, indices: Sequence[int] | None = None
                             ) -> tuple[list[Tensor], list[Tensor]]:
        """`logprobs`, and the entropy of the policy's next-token distribution at every
        response token (at the sampling temperature; float32, CPU): verl computes both in
        its old log-prob pass. The log-probs are the same numbers as `logprobs`'.
        `indices`: these conversations only (the others' rows stay empty)."""
        out, ent, _ = self._per_token(batch, with_entropy=True, indices=indices)
        return out, ent

    def logprobs_entropy_and_values(self, batch: RolloutBatch,
                                    indices: Sequence[int] | None = None
                                    ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        """`logprobs_and_entropy`, and from the same forward the value head's V(s_t) at
        every response token (critic.value_model policy_head; float32, CPU)."""
        return self._per_token(batch, with_entropy=True, with_values=True, indices=indices)

    def values(self, batch: RolloutBatch, indices: Sequence[int] | None = None
               ) -> list[Tensor]:
        """The value head's V(s_t) at every response token (float32, CPU), in eval mode: a
        pass of its own, for a step whose old log-probs need none."""
        return self._per_token(batch, with_entropy=False, with_values=True, indices=indices)[2]

    @torch.no_grad()
    def _per_token(self, batch: RolloutBatch, *, with_entropy: bool, with_values: bool = False,
                   indices: Sequence[int] | None = None
                   ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
        if with_values and self.value_head is None:
            raise ValueError("values need a value head on the policy "
                             "(critic.value_model policy_head)")
        was_training = self.model.training
        self.model.eval()
        n = len(batch.conversations)
        out: list[Tensor] = [torch.empty(0)] * n
        ent: list[Tensor] = [torch.empty(0)] * n if with_entropy else []
        vals: list[Tensor] = [torch.empty(0)] * n if with_values else []
        everything = list(range(n)) if indices is None else list(indices)
        try:
            micros = ([[everything[p] for p in positions]
                       for positions in self.micro_batches(batch, everything)]
                      if everything else [])
            padding = padding_passes(self.sharded_over, len(micros))  # agreed before any forward
            for micro in micros:
                tensors = batch.collate(micro, self.pad_id)
                lp, h, v = self._forward(tensors, with_entropy=with_entropy,
                                         with_values=with_values)
                mask = tensors["response_mask"]
                for into, values in ((out, lp), (ent, h), (vals, v)):
                    if values is not None:
                        for i, row in zip(micro, response_rows(values, mask), strict=True):
                            into[i] = row
            for _ in range(padding):
                self._forward(padding_micro_batch(self.pad_id))
        finally:
            self.model.train(was_training)
        return out, ent, vals


class Reference(_PolicyModel):
    """The frozen initial policy: a separate model, or the policy with its LoRA adapters
    disabled (`model` is then the PEFT policy itself)."""

    def __init__(self, model: Any, config: RLConfig, *, adapters_off: bool = False, **kw: Any):
        super().__init__(model, config, **kw)
        self.adapters_off = adapters_off

    def logprobs(self, batch: RolloutBatch) -> list[Tensor]:
        if not self.adapters_off:
            return super().logprobs(batch)
        with self.model.disable_adapter():
            return super().logprobs(batch)


_LOSS_INPUTS = ("loss_mask", "old_logprobs", "rollout_logprobs", "advantages", "ref_logprobs",
                "returns", "values")
"""The keys of a collated micro-batch the update's losses read (those it has)."""


class Actor(_PolicyModel):
    """The policy being trained: its optimizer, lr schedule and PPO update."""

    def __init__(
        self,
        model: Any,
        config: RLConfig,
        *,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        grad_clip: float,
        peak_flops: float | None = None,
        value_head: PolicyValueHead | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(model, config, **kw)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_clip = grad_clip
        self.peak_flops = peak_flops
        """Peak FLOP/s of the accelerator in the compute dtype: `update` reports perf/mfu."""
        if value_head is not None:
            if self.sharded_over is not None:
                raise ValueError("a value head on the policy is not sharded: not with FSDP")
            owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
            if not all(id(p) in owned for p in value_head.parameters()):
                raise ValueError("the value head's parameters must be in the actor's optimizer")
        self.value_head = value_head

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.optimizer.param_groups[0]["lr"])

    def update(
        self, batch: RolloutBatch, dist: Dist = Dist(), *, guard: LogprobGuard | None = None,
        first_on_policy: bool = False,
    ) -> UpdateStats:
        """PPO epochs over mini-batches; one optimizer step each; then one lr-schedule step.

        Returns what it measured (`UpdateStats`; `.metrics()`: the `actor/*` and `perf/*`
        keys of the step's log): losses are mini-batch values averaged over optimizer steps;
        clip fractions and PPO-KL are means over every loss token of the update; padding
        waste, tokens per micro-batch, model TFLOP/s and, with a peak, MFU.

        A batch without old log-probs must be on-policy (ppo_epochs 1, one mini-batch): no
        weight has changed before its only optimizer step, so each micro-batch's log-probs
        are the old ones, and the loss takes them detached from the same forward
        (`UpdateStats.old_pass` returns them). `guard` then checks them against the engine's
        before the optimizer step: past its bound the update stops with no weight changed.

        `first_on_policy` (ppo_epochs 1, several mini-batches): the same for the first
        mini-batch only, whose conversations' rows in the batch's old log-probs are
        placeholders (the separate pass covered the others). `UpdateStats.old_pass` then
        holds every conversation's old log-probs (the batch's for the others) and the first
        mini-batch's entropies; `guard` checks all of them before the first optimizer step.
        """
        cfg = self.config
        head = self._value_head_before(batch, dist)  # the batch checked; the head's metrics
        log = UpdateLog(kl=self._kl_loss, value_head=head is not None)
        # With data parallelism every rank walks the same global mini-batches (its share of
        # each may be empty) and takes the same optimizer steps.
        minis = batch.mini_batches(cfg.ppo_mini_batch_size)
        if not minis:
            raise ValueError("update needs at least one conversation")
        old = self._on_policy_old(batch, len(minis), first_on_policy)
        shape, flops, start = ModelShape.of(self.model), 0.0, time.perf_counter()
        self.model.train()
        for _epoch in range(cfg.ppo_epochs):
            for k, mini in enumerate(minis):
                own = old if k == 0 else None  # the first optimizer step is on-policy
                norm = batch.loss_norm(mini, cfg.loss_agg_mode, scale_factor=cfg.loss_scale_factor)
                norm = norm.with_global_count(dist.all_reduce_sum)
                self.optimizer.zero_grad(set_to_none=True)
                micros = self.micro_batches(batch, mini) if mini else []
                padding = padding_passes(self.sharded_over, len(micros))  # before any forward
                terms: list[Tensor] = []  # each micro-batch's loss terms, on the device
                for positions in micros:  # forward + backward: its exact share of the loss
                    indices = [mini[p] for p in positions]
                    flops += self._account(batch, indices, shape, log)
                    terms.append(self._micro_step(batch, indices, norm.rows(positions), log, own))
                self._padding_backward(padding)
                if own is not None:  # the old log-probs, checked before any weight changes
                    own.read()
                    if guard is not None:
                        own.mismatch.update(guard.check(own.logprobs, dist))
                self._optimizer_step(terms, log, dist)
        self.scheduler.step()
        log.throughput(flops, time.perf_counter() - start, self.peak_flops)
        return log.stats(dist, old=old, head=head)

    @property
    def _kl_loss(self) -> bool:
        """Whether the loss has a KL term (rl.use_kl_loss with a coefficient above 0)."""
        return self.config.use_kl_loss and self.config.kl_loss_coef > 0

    def _value_head_before(self, batch: RolloutBatch, dist: Dist) -> HeadBefore | None:
        """Checks that the batch has what the loss terms read; the value head's statistics
        and learning rate before the update (None without a value head)."""
        if batch.advantages is None:
            raise ValueError("update needs advantages in the batch")
        if self._kl_loss and batch.ref_logprobs is None:
            raise ValueError("a KL loss needs reference log-probs in the batch")
        if self.value_head is None:
            return None
        if batch.values is None or batch.returns is None:
            raise ValueError("a value head on the policy needs values and returns in the batch")
        return HeadBefore(batch_value_statistics(batch, all_reduce_sum=dist.all_reduce_sum),
                          float(self.optimizer.param_groups[-1]["lr"]))

    def _padding_backward(self, passes: int) -> None:
        """FSDP: as many forwards and backwards as the busiest rank, of zero gradient."""
        for _ in range(passes):
            lp, _, _ = self._forward(padding_micro_batch(self.pad_id))
            (lp.sum() * 0.0).backward()  # zero gradients, same collectives

    def _optimizer_step(self, terms: list[Tensor], log: UpdateLog, dist: Dist) -> None:
        """Sum the gradients over ranks, clip, step; log the mini-batch's loss terms (summed
        over its micro-batches, in order, and over ranks) and the gradient norms."""
        losses = torch.zeros(len(log.loss_names), dtype=torch.float64)
        for row in torch.stack(terms).cpu() if terms else []:
            losses += row  # read once per optimizer step, summed in order
        head_params = self.value_head.parameters() if self.value_head is not None else []
        if self.sharded_over is None:  # FSDP's reduce-scatter already summed them
            dist.sum_gradients([p for p in self.model.parameters() if p.requires_grad]
                               + head_params)
        head_norm = _grad_norm(head_params) if self.value_head is not None else None
        if head_norm is not None:
            log.head_grad_norm(head_norm)
        grad_norm = optimizer_step(self.model, self.optimizer, self.grad_clip,
                                   extra_params=head_params)
        log.optimizer_step(dist.all_reduce_sum(losses), grad_norm, head_norm)

    def _on_policy_old(self, batch: RolloutBatch, num_mini_batches: int,
                       first_on_policy: bool) -> OldPass | None:
        """Where the update keeps the old log-probs it takes from its first optimizer step's
        forwards (None: the batch has them all)."""
        cfg, n = self.config, len(batch.conversations)
        if first_on_policy:
            if cfg.ppo_epochs != 1 or batch.old_logprobs is None:
                raise ValueError("first_on_policy needs ppo_epochs 1 and the other "
                                 "mini-batches' old log-probs in the batch")
            return OldPass(list(batch.old_logprobs), [torch.empty(0)] * n, {})
        if batch.old_logprobs is not None:
            return None
        if cfg.ppo_epochs != 1 or num_mini_batches != 1:
            raise ValueError(
                f"update needs old log-probs in the batch: it takes {cfg.ppo_epochs} "
                f"epoch(s) of {num_mini_batches} mini-batch(es), not one optimizer step")
        return OldPass([torch.empty(0)] * n, [torch.empty(0)] * n, {})

    def _account(self, batch: RolloutBatch, indices: list[int], shape: ModelShape | None,
                 log: UpdateLog) -> float:
        """Records a micro-batch's padding waste and size; returns its training FLOPs (0
        when the model's shape is unknown)."""
        lens = [batch.conversations[i].num_tokens for i in indices]
        computed = sum(lens) if self.packed else len(lens) * max(lens)
        log.micro_batch(sum(lens), computed)
        if shape is None:
            return 0.0
        responses = sum(len(batch.conversations[i].response_ids) for i in indices)
        return train_flops(lens, shape, logit_tokens=responses)

    def _micro_step(self, batch: RolloutBatch, indices: list[int], norm: LossNorm,
                    log: UpdateLog, old: OldPass | None = None) -> Tensor:
        """Forward + backward of one micro-batch; returns its shares of the loss terms
        (`LossTerms.detached`: read once per optimizer step). `old` given (on-policy): the
        old log-probs are this forward's, detached, and are kept there with the entropies
        (`OldPass.keep`)."""
        cfg, head = self.config, self.value_head
        tensors = batch.collate(indices, self.pad_id)
        inputs = on_device(tensors, _LOSS_INPUTS, self.device)  # queued, before the forward
        logprobs, entropy, vpreds = self._forward(
            tensors, with_entropy=True, entropy_grad=cfg.entropy_coeff != 0,
            with_values=head is not None,
        )
        mask, tokens = inputs["loss_mask"], inputs["loss_mask"].sum()
        if old is None:
            old_lp = inputs["old_logprobs"]
        else:  # ratio 1; the gradient is the policy gradient
            old_lp = logprobs.detach()
            old.keep(indices, tensors["response_mask"], old_lp, entropy)
        agg = dict(mode=cfg.loss_agg_mode, norm=norm)
        is_weights = self._rollout_is_weights(old_lp, inputs, log)
        pg, diagnostics = policy_loss(
            logprobs, old_lp, inputs["advantages"], mask,
            clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg_mode, norm=norm,
            weights=is_weights,
        )
        terms = LossTerms(
            pg=pg,
            entropy=agg_loss(entropy, mask, **agg),
            kl=(agg_loss(kl_penalty(logprobs, inputs["ref_logprobs"], cfg.kl_loss_type),
                         mask, **agg) if self._kl_loss else None),
            vf=self._value_loss(vpreds, inputs, agg, log) if head is not None else None,
        )
        terms.total(cfg, head).backward()
        log.policy(diagnostics, tokens)
        return terms.detached()

    def _rollout_is_weights(self, old_logprobs: Tensor, inputs: dict[str, Tensor],
                            log: UpdateLog) -> Tensor | None:
        """Truncated IS weights π_old / π_rollout, capped (rl.rollout_is), else None."""
        cfg = self.config
        if cfg.rollout_is is None:
            return None
        mask = inputs["loss_mask"]
        weights = rollout_is_weights(old_logprobs, inputs["rollout_logprobs"], mask,
                                     level=cfg.rollout_is, threshold=cfg.rollout_is_threshold)
        log.rollout_is(weights, mask.sum())
        return weights

    def _value_loss(self, vpreds: Tensor | None, inputs: dict[str, Tensor],
                    agg: dict[str, Any], log: UpdateLog) -> Tensor:
        """The value head's clipped value loss, aggregated as the policy loss is."""
        head, mask = self.value_head, inputs["loss_mask"]
        assert vpreds is not None and head is not None
        mat, clipfrac = value_loss(vpreds, inputs["returns"], inputs["values"], mask,
                                   head.cliprange_value)
        tokens = mask.sum()
        log.value_head(clipfrac, masked_mean(vpreds.detach(), mask), tokens)
        return agg_loss(mat, mask, **agg)

"""What one `Actor.update` measures, typed: the loss terms of a micro-batch (`LossTerms`),
the running log of the update (`UpdateLog`, the one place its metric names are written),
what it returns (`UpdateStats`; with a value head on the policy, its `CriticStats`), and the
old log-probs an on-policy update takes from its own forward (`OldPass`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from memrl.distributed import Dist
from memrl.rl.config import RLConfig
from memrl.rl.maths.batch import response_rows
from memrl.rl.maths.flops import mfu, padding_waste
from memrl.rl.trainer.averages import RunningAverages
from memrl.rl.trainer.values import CriticStats, PolicyValueHead

__all__ = ["HeadBefore", "LossTerms", "OldPass", "UpdateLog", "UpdateStats"]


_REPLICATED = frozenset({"actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm",
                         "actor/skipped_nonfinite_steps", "critic/vf_loss", "critic/grad_norm"})
"""Metrics every rank computes from all-reduced values, so they agree on every rank."""


@dataclass(frozen=True, kw_only=True)
class UpdateStats:
    """What one `Actor.update` measured, over every rank's share of it. Losses, grad norms
    and skipped steps are means over its optimizer steps; the policy-loss diagnostics and
    the IS weights means over its loss tokens; padding waste is weighted by computed tokens
    and tokens_per_micro_batch is a mean over micro-batches. None: not measured (no KL
    loss, no rollout IS, no loss token, no micro-batch, an unknown model shape or peak)."""

    padding_waste: float | None = None
    """Padded tokens / computed tokens of the forward passes (`memrl.rl.maths.flops`)."""
    tokens_per_micro_batch: float | None = None
    """Computed tokens (with padding, unless packed) per micro-batch."""
    rollout_is_weight: float | None = None
    """Mean truncated importance weight π_old / π_rollout (rl.rollout_is)."""
    pg_clipfrac: float | None = None
    """Fraction of loss tokens whose ratio was clipped (above)."""
    pg_clipfrac_lower: float | None = None
    """Fraction of loss tokens clipped by the dual-clip bound (negative advantages)."""
    ppo_kl: float | None = None
    """Approximate KL(π_old ‖ π) over the loss tokens."""
    pg_loss: float
    entropy: float
    kl_loss: float | None = None
    """The KL loss term (rl.use_kl_loss) before its coefficient."""
    grad_norm: float
    """Global gradient norm before clipping."""
    skipped_nonfinite_steps: float
    """Fraction of optimizer steps skipped for a NaN/inf gradient norm."""
    update_tflops_per_s: float | None = None
    """Model FLOPs of the update per second of it (`memrl.rl.maths.flops`), in TFLOP/s."""
    mfu: float | None = None
    """Model FLOPs utilisation, given the accelerator's peak."""
    old_pass: OldPass | None = field(default=None, compare=False, repr=False)
    """Not a metric: the old log-probs the update took from its own forward (a batch
    without old log-probs, or its first mini-batch's with `first_on_policy`, the others'
    then the batch's), else None."""
    critic: CriticStats | None = field(default=None, compare=False, repr=False)
    """The value head on the policy's `critic/*` metrics (critic.value_model policy_head),
    logged by the recipe as a separate critic's are; else None."""

    PERF = frozenset({"padding_waste", "tokens_per_micro_batch", "update_tflops_per_s", "mfu"})
    """Fields logged under `perf/`; the others under `actor/` (old_pass is not logged)."""

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> UpdateStats:
        """The stats of a `{"actor/pg_loss": ..., "perf/mfu": ...}` dict (`metrics`' inverse)."""
        return cls(**{key.split("/", 1)[1]: value for key, value in metrics.items()})

    def metrics(self) -> dict[str, float]:
        """The `actor/*` and `perf/*` metrics of the step's log, measured ones only (the
        value head's `critic/*`: `critic.metrics()`)."""
        return {
            f"{'perf' if f.name in self.PERF else 'actor'}/{f.name}": value
            for f in fields(self)
            if f.name not in ("old_pass", "critic") and (value := getattr(self, f.name)) is not None
        }


@dataclass(frozen=True)
class LossTerms:
    """One micro-batch's terms of the actor's loss, each its exact share of the mini-batch's
    (aggregated by rl.loss_agg_mode with the mini-batch's divisor, `LossNorm`):

        L = L_pg − c_ent · H + c_kl · KL(π ‖ π_ref) + c_vf · L_vf

    `kl` with rl.use_kl_loss, `vf` with a value head on the policy (shared-body PPO), else
    None."""

    pg: Tensor
    entropy: Tensor
    kl: Tensor | None = None
    vf: Tensor | None = None

    def total(self, config: RLConfig, head: PolicyValueHead | None) -> Tensor:
        """L, the tensor to differentiate."""
        loss = self.pg - config.entropy_coeff * self.entropy if config.entropy_coeff else self.pg
        if self.kl is not None:
            loss = loss + config.kl_loss_coef * self.kl
        if self.vf is not None and head is not None:
            loss = loss + head.vf_coef * self.vf
        return loss

    def detached(self) -> Tensor:
        """The terms present, detached, as one float64 row on the device (read once per
        optimizer step), in `UpdateLog.loss_names`' order."""
        return torch.stack([t.detach().reshape(()).double()
                            for t in (self.pg, self.entropy, self.kl, self.vf) if t is not None])


class UpdateLog:
    """What an `Actor.update` measures as it runs, each kind of measurement one method: the
    running averages behind `UpdateStats` (and, with a value head, its `CriticStats`). The
    metric names of the update are written here and nowhere else in it."""

    def __init__(self, *, kl: bool, value_head: bool) -> None:
        self.averages = RunningAverages()
        self.loss_names = ("actor/pg_loss", "actor/entropy", *(("actor/kl_loss",) if kl else ()),
                           *(("critic/vf_loss",) if value_head else ()))
        """The loss terms `LossTerms.detached` gives, in order."""

    def micro_batch(self, real_tokens: int, computed_tokens: int) -> None:
        """A micro-batch's padding waste and size."""
        self.averages.add("perf/padding_waste", padding_waste(real_tokens, computed_tokens),
                          computed_tokens)
        self.averages.add("perf/tokens_per_micro_batch", computed_tokens)

    def rollout_is(self, weights: Tensor, tokens: Tensor) -> None:
        """The truncated IS weights of a micro-batch's loss tokens (`tokens` of them)."""
        self.averages.add("actor/rollout_is_weight",
                          weights.sum().double() / tokens.clamp(min=1).double(), tokens)

    def value_head(self, clipfrac: Tensor, vpred_mean: Tensor, tokens: Tensor) -> None:
        self.averages.add("critic/vf_clipfrac", clipfrac, tokens)
        self.averages.add("critic/vpred_mean", vpred_mean, tokens)

    def policy(self, diagnostics: dict[str, Tensor], tokens: Tensor) -> None:
        """`policy_loss`'s diagnostics (clip fractions, PPO-KL) over a micro-batch's tokens."""
        for name, value in diagnostics.items():
            self.averages.add(f"actor/{name}", value, tokens)

    def optimizer_step(self, losses: Tensor, grad_norm: float, head_grad_norm: float | None
                       ) -> None:
        """One optimizer step: its loss terms (summed over micro-batches and ranks), the
        gradient norms, and whether it was skipped."""
        for name, value in zip(self.loss_names, losses.tolist(), strict=True):
            self.averages.add(name, value)
        self.averages.add("actor/grad_norm", grad_norm)
        self.averages.add("actor/skipped_nonfinite_steps", float(not math.isfinite(grad_norm)))

    def head_grad_norm(self, norm: float) -> None:
        if math.isfinite(norm):
            self.averages.add("critic/grad_norm", norm)

    def throughput(self, flops: float, elapsed: float, peak_flops: float | None) -> None:
        if flops > 0:
            self.averages.add("perf/update_tflops_per_s", flops / elapsed / 1e12)
            if peak_flops:
                self.averages.add("perf/mfu", mfu(flops, elapsed, peak_flops))

    def stats(self, dist: Dist, *, old: OldPass | None, head: HeadBefore | None
              ) -> UpdateStats:
        """The averages over every rank's share of the update."""
        metrics = self.averages.reduced(dist, _REPLICATED)
        own = {k.split("/", 1)[1]: metrics.pop(k) for k in list(metrics)
               if k.startswith("critic/")}
        critic = None if head is None else CriticStats(
            vf_loss=own["vf_loss"], grad_norm=own.get("grad_norm", float("nan")),
            vf_clipfrac=own.get("vf_clipfrac", 0.0), vpred_mean=own.get("vpred_mean", 0.0),
            lr=head.lr, **head.statistics)
        return replace(UpdateStats.from_metrics(metrics), old_pass=old, critic=critic)


@dataclass(frozen=True)
class HeadBefore:
    """The value head's `critic/*` measured before the update: the batch's values, returns
    and explained variance (`batch_value_statistics`), and the head's learning rate."""

    statistics: dict[str, float]
    lr: float


@dataclass
class OldPass:
    """What the separate old log-prob pass would have given, taken from the update's own
    forward on-policy (this rank's conversations, float32, CPU, as
    `Actor.logprobs_and_entropy`), and the engine guard's metrics. With `first_on_policy`
    the first mini-batch's rows come from the forward, the other log-probs are the batch's
    (from the separate pass) and the other entropies stay empty."""

    logprobs: list[Tensor]
    entropy: list[Tensor]
    mismatch: dict[str, float]
    """`rollout/logprob_diff_*` (`LogprobGuard.check`); {} without a guard."""
    pending: list[tuple[list[int], Tensor, Tensor, Tensor]] = field(default_factory=list)
    """Micro-batches not read yet: (conversations, response mask on the CPU, log-probs and
    entropies on the device), read together by `read` (no synchronisation per row)."""

    def keep(self, indices: list[int], response: Tensor, logprobs: Tensor,
             entropy: Tensor) -> None:
        """Keep a micro-batch's (rows, L) log-probs and entropies, detached, to `read`."""
        self.pending.append((indices, response, logprobs.detach(), entropy.detach()))

    def read(self) -> None:
        """Each kept row's response tokens into `logprobs` / `entropy` (float32, CPU)."""
        for indices, response, lp, ent in self.pending:
            for into, values in ((self.logprobs, lp), (self.entropy, ent)):
                for i, row in zip(indices, response_rows(values, response), strict=True):
                    into[i] = row
        self.pending.clear()

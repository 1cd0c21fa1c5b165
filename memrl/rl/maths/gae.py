"""PPO with a learned value model: GAE advantages and returns, the clipped value loss, and
how values and rewards are laid out over a trajectory of several conversations.

Pure functions over tensors (the critic that produces the values is `memrl.rl.trainer.critic`).
Per-token tensors are ``(batch, seq)`` with a response mask; values sit where the batch puts
every per-token number (`memrl.rl.maths.batch.collate`: the logit position that predicts the
token), so ``values[b, t]`` is V(s_t), the value of the context *before* response token t,
as verl's critic (`values[:, -response_length - 1 : -1]`).

    advantages, returns = gae_advantages_returns(token_rewards, values, mask, gamma, lam)
    advantages          = masked_whiten(advantages, mask)      (verl whitens over the batch;
                                                               all_reduce_sum: over ranks)
    vf_loss, clipfrac   = value_loss(vpreds, returns, old_values, mask, cliprange_value)

Multi-conversation trajectories (`trajectory_gae`; docs/algorithms.md): the conversations of
one trajectory (MemAgent's memory updates and final answer, MemoryUpdate's tool turns) are
chained in turn order into one sequence of response tokens; the trajectory's reward sits on
the last response token of its last conversation; GAE runs over the chain, so the bootstrap
of a conversation's last token is the value of the first response token of the next
conversation of the same trajectory (0 after the last one). This is verl's recurrence over
its multi-turn sequence, whose response mask skips the tokens between assistant turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from memrl.rl.maths.batch import RolloutBatch

__all__ = [
    "explained_variance",
    "gae_advantages_returns",
    "gae_batch",
    "masked_whiten",
    "reduced_moments",
    "trajectory_gae",
    "value_loss",
    "value_statistics",
    "whitening_stats",
]


# Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438, eq. 16), backwards
# over the tokens of each row, skipping positions outside the mask (verl
# `compute_gae_advantage_return`, verl/trainer/ppo/core_algos.py):
#   delta_t = r_t + gamma * V(next) - V(s_t)
#   A_t     = delta_t + gamma * lam * A(next)
#   R_t     = A_t + V(s_t)                       (the value target)
# where "next" is the next masked-in position of the row (V = 0, A = 0 past the last one).
# At masked-out positions A and V(next) are carried through unchanged. Unlike verl, the
# advantages are returned unwhitened: `masked_whiten` is a separate step.
def gae_advantages_returns(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """(advantages, returns), each (batch, seq), of GAE(gamma, lam) over each row's masked
    positions. Outside the mask the numbers are those verl leaves there (callers mask them)."""
    if not token_rewards.shape == values.shape == mask.shape or token_rewards.dim() != 2:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and "
            f"mask {tuple(mask.shape)} must be the same (batch, seq) shape"
        )
    with torch.no_grad():
        m = mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        last = torch.zeros_like(values[:, 0])
        out = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            delta = token_rewards[:, t] + gamma * next_value - values[:, t]
            adv = delta + gamma * lam * last
            next_value = values[:, t] * m[:, t] + (1 - m[:, t]) * next_value
            last = adv * m[:, t] + (1 - m[:, t]) * last
            out[:, t] = last
        return out, out + values


AllReduceSum = Callable[[Tensor], Tensor]
"""Adds a tensor over data-parallel ranks (`memrl.distributed.Dist.all_reduce_sum`); every
rank calls it the same number of times, with a tensor of the same shape."""


def _local(t: Tensor) -> Tensor:
    return t


def reduced_moments(x: Tensor, weights: Tensor, *, all_reduce_sum: AllReduceSum | None = None,
                    eps: float = 0.0) -> tuple[float, Tensor, Tensor]:
    """(total weight W, means Σwx / (W + eps), Σw(x - mean)²) of each row of `x` (float64,
    last dimension the positions, `weights` one per position), over every data-parallel
    rank's positions with `all_reduce_sum`: the weighted sums and W are added over ranks, then
    the squared deviations from those global means (two passes, as on one process; two
    all-reduces whatever W is, so every rank calls it alike, one with no position included)."""
    reduce = all_reduce_sum or _local
    x, w = x.to(torch.float64), weights.to(torch.float64)
    sums = reduce(torch.cat([(x * w).sum(-1).reshape(-1), w.sum().reshape(1)]).cpu())
    total = float(sums[-1])
    means = sums[:-1].reshape(x.shape[:-1]) / (total + eps)
    deviations = (w * (x - means.to(x.device).unsqueeze(-1)) ** 2).sum(-1)
    return total, means, reduce(deviations.reshape(-1).cpu()).reshape(x.shape[:-1])


def whitening_stats(values: Tensor, mask: Tensor, *, all_reduce_sum: AllReduceSum | None = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, unbiased variance, count), float64 scalars, of the masked positions (verl's
    `masked_mean` / `masked_var`, their 1e-8 included); the variance is nan below 2 positions.

    `all_reduce_sum`: statistics of every data-parallel rank's masked values together, each
    rank passing its own (`reduced_moments`). Every rank must call this, a rank with no
    masked value included, and gets the same numbers."""
    m = mask.to(torch.float64)
    x = torch.where(mask.bool(), values.to(torch.float64), torch.zeros((), dtype=torch.float64))
    total, mean, sq = reduced_moments(x.reshape(-1), m.reshape(-1), all_reduce_sum=all_reduce_sum,
                                      eps=1e-8)
    n = torch.tensor(total, dtype=torch.float64)
    if n < 2:
        return mean, torch.tensor(float("nan"), dtype=torch.float64), n
    return mean, sq / (n + 1e-8) * (n / (n - 1)), n


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, *,
                  all_reduce_sum: AllReduceSum | None = None) -> Tensor:
    """(values - mean) / sqrt(var + 1e-8) with the mean and the unbiased variance over the
    masked positions (verl `masked_whiten`, verl/utils/torch_functional.py); shift_mean=False
    adds the mean back. Needs at least 2 masked positions (verl raises the same).

    The statistics are computed in float64 (`whitening_stats`); with `all_reduce_sum`, over
    every data-parallel rank's masked values, so N ranks holding parts of a batch get the
    numbers one process gets for the whole batch."""
    mean, var, n = whitening_stats(values, mask, all_reduce_sum=all_reduce_sum)
    if n < 2:
        raise ValueError(f"whitening needs at least 2 masked values, got {int(n)}")
    mean, var = mean.to(values.device), var.to(values.device)
    whitened = (values.to(torch.float64) - mean) * torch.rsqrt(var + 1e-8)
    return (whitened + mean if not shift_mean else whitened).to(values.dtype)


# PPO's clipped value loss (verl `compute_value_loss`, core_algos.py, from TRL's PPO trainer):
#   V_clip = clamp(V_new, V_old - c, V_old + c)
#   loss   = 0.5 * agg(max((V_new - R)^2, (V_clip - R)^2))
# The caller aggregates the per-token matrix (`losses.agg_loss`, exact over micro-batches);
# the clip fraction is the share of masked tokens where the clipped term is the larger.
def value_loss(
    vpreds: Tensor, returns: Tensor, old_values: Tensor, mask: Tensor, cliprange_value: float
) -> tuple[Tensor, Tensor]:
    """(per-token loss matrix 0.5 * max(unclipped, clipped squared error), clip fraction over
    the mask); aggregate the matrix with `memrl.rl.maths.losses.agg_loss`."""
    clipped = torch.max(torch.min(vpreds, old_values + cliprange_value),
                        old_values - cliprange_value)
    loss1 = (vpreds - returns) ** 2
    loss2 = (clipped - returns) ** 2
    m = mask.to(vpreds.dtype)
    clipfrac = ((loss2 > loss1).to(vpreds.dtype) * m).sum() / (m.sum() + 1e-8)
    return 0.5 * torch.max(loss1, loss2), clipfrac.detach()


def value_statistics(returns: Tensor, values: Tensor, mask: Tensor, *,
                     all_reduce_sum: AllReduceSum | None = None) -> dict[str, float]:
    """Over the masked positions: the mean value and return, and the explained variance
    1 - Var(returns - values) / (Var(returns) + 1e-5), unbiased variances (verl metric_utils
    `critic/values/mean`, `critic/returns/mean`, `critic/vf_explained_var`); nan for a mean
    of no position, and for the explained variance with fewer than 2. In float64.

    `all_reduce_sum`: over every data-parallel rank's positions (sums and counts added over
    ranks, then the squared deviations from the global means); every rank must call it."""
    sel = mask.bool()
    r, v = returns[sel].to(torch.float64), values[sel].to(torch.float64)
    n, (mr, mv, _), (ssr, _, ssd) = reduced_moments(torch.stack([r, v, r - v]),
                                                    torch.ones_like(r),
                                                    all_reduce_sum=all_reduce_sum)
    nan = float("nan")
    out = {"values_mean": float(mv) if n else nan, "returns_mean": float(mr) if n else nan,
           "vf_explained_var": nan}
    if n >= 2:
        out["vf_explained_var"] = 1.0 - (float(ssd) / (n - 1)) / (float(ssr) / (n - 1) + 1e-5)
    return out


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor, *,
                       all_reduce_sum: AllReduceSum | None = None) -> float:
    """1 - Var(returns - values) / (Var(returns) + 1e-5) over the masked positions, unbiased
    variances (verl metric_utils `critic/vf_explained_var`); nan with fewer than 2.
    `all_reduce_sum`: over every data-parallel rank's positions (`value_statistics`)."""
    return value_statistics(returns, values, mask,
                            all_reduce_sum=all_reduce_sum)["vf_explained_var"]


def trajectory_gae(
    values: Sequence[Tensor],
    traj_index: Sequence[int],
    rewards: Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[list[Tensor], list[Tensor]]:
    """Per-token (advantages, returns) of every conversation, unwhitened.

    `values[i]` holds V at each response token of conversation i, `traj_index[i]` its
    trajectory (conversations of a trajectory in turn order), `rewards` one per trajectory.
    Each trajectory's conversations are chained into one row (see the module docstring):
    its reward on the very last response token, GAE over the row, then split back.
    """
    if len(values) != len(traj_index):
        raise ValueError(f"{len(values)} value rows for {len(traj_index)} conversations")
    rows: list[list[int]] = [[] for _ in range(rewards.shape[0])]
    for i, k in enumerate(traj_index):
        rows[k].append(i)
    width = max([sum(values[i].numel() for i in row) for row in rows] + [1])
    v = torch.zeros(len(rows), width, dtype=torch.float32)
    r = torch.zeros_like(v)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for k, row in enumerate(rows):
        chained = torch.cat([values[i].float() for i in row]) if row else torch.zeros(0)
        n = chained.numel()
        v[k, :n], mask[k, :n] = chained, True
        if n:
            r[k, n - 1] = float(rewards[k])
    adv, ret = gae_advantages_returns(r, v, mask, gamma, lam)
    advantages: list[Tensor] = [torch.empty(0)] * len(values)
    returns: list[Tensor] = [torch.empty(0)] * len(values)
    for k, row in enumerate(rows):
        start = 0
        for i in row:
            n = values[i].numel()
            advantages[i], returns[i] = adv[k, start:start + n], ret[k, start:start + n]
            start += n
    return advantages, returns


def gae_batch(batch: RolloutBatch, *, gamma: float, lam: float,
              all_reduce_sum: AllReduceSum | None = None) -> RolloutBatch:
    """The batch with per-token advantages and returns: `trajectory_gae` over its samples
    (in the batch's order, which is turn order within each trajectory) from its values and
    rewards, then the advantages whitened over every response token of the batch, as verl
    (left as they are when the batch has fewer than 2 response tokens).

    Data parallelism: each rank passes its share of the step (whole trajectories: GAE needs
    nothing of the other ranks) and `all_reduce_sum`; the whitening's mean and variance are
    then those of every rank's response tokens together (`whitening_stats`), so the
    advantages are the ones one process computes for the whole step."""
    if batch.values is None:
        raise ValueError("GAE needs the critic's values in the batch (with_values)")
    adv, ret = trajectory_gae(batch.values, [s.traj_index for s in batch.conversations],
                              batch.rewards, gamma=gamma, lam=lam)
    flat = torch.cat(adv).unsqueeze(0) if adv else torch.zeros(1, 0)
    mask = torch.ones_like(flat, dtype=torch.bool)
    mean, var, n = whitening_stats(flat, mask, all_reduce_sum=all_reduce_sum)
    if n >= 2:
        flat = ((flat.double() - mean) * torch.rsqrt(var + 1e-8)).to(flat.dtype)
    return batch.with_token_advantages(list(flat[0].split([a.numel() for a in adv])), ret)

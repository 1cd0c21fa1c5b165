"""Outcome advantages: one scalar per trajectory, computed within its group.

A *group* is every trajectory sampled for the same question (``Trajectory.record_id``).
Groups are found by id, never by reshaping the batch to a fixed width: groups may have
different sizes (a failed rollout, a filtered sample, a batch that mixes ``n`` values).

All functions take ``rewards`` of shape ``(num_trajectories,)`` and a parallel sequence of
hashable group ids, and return a tensor of the same shape and float dtype. The caller gives
each conversation (Turn) of a trajectory that trajectory's advantage.

Conventions shared by every estimator here (and where they differ from verl):
- A group of size 1 gets advantage exactly 0 by default (``size1="zero"``): it has no
  baseline to compare against. ``size1="raw_reward"`` is verl's behaviour instead: GRPO uses
  mean 0 and std 1 for such groups (the advantage is the raw reward, over 1 + eps with the
  std division), RLOO keeps the raw reward, REINFORCE++-baseline uses mean 0 before
  whitening.
- A group whose rewards are all equal gets advantage exactly 0. Mathematically it already
  is, but ``r - mean(r)`` in floating point can leave a 1-ulp residue that the GRPO
  division by ``std + eps`` would blow up to a visible number (e.g. 0.007 in float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from memrl.rl.maths.gae import reduced_moments

SIZE1_MODES = ("zero", "raw_reward")
"""How a group of one trajectory is treated (see the module docstring)."""

__all__ = [
    "ESTIMATORS",
    "SIZE1_MODES",
    "compute_advantages",
    "GroupStats",
    "dynamic_sampling_keep",
    "grpo_advantages",
    "group_stats",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
]


@dataclass(frozen=True)
class GroupStats:
    """Per-trajectory view of its group's statistics (every field has shape (n,))."""

    index: Tensor
    """Group number of each trajectory (0..num_groups-1, in order of first appearance)."""
    size: Tensor
    """Number of trajectories in the group (long)."""
    mean: Tensor
    """Group mean reward."""
    std: Tensor
    """Unbiased group std (as torch.std, Bessel-corrected); 0 for a group of size 1."""
    all_equal: Tensor
    """True where every reward of the group is the same (always true for size 1)."""


def _as_rewards(rewards: Tensor | Sequence[float]) -> Tensor:
    r = rewards if isinstance(rewards, Tensor) else torch.as_tensor(rewards)
    if not torch.is_floating_point(r):
        r = r.to(torch.float32)
    if r.dim() != 1:
        raise ValueError(f"rewards must have shape (num_trajectories,), got {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError(f"rewards must be finite, got {r.tolist()}")
    return r


def _check_size1(size1: str) -> None:
    if size1 not in SIZE1_MODES:
        raise ValueError(f"size1 must be one of {', '.join(SIZE1_MODES)}, got {size1!r}")


def _baseline(st: GroupStats, size1: str) -> tuple[Tensor, Tensor]:
    """(group mean, which trajectories get advantage 0) under the size-1 convention."""
    _check_size1(size1)
    single = st.size == 1
    if size1 == "raw_reward":
        return torch.where(single, torch.zeros_like(st.mean), st.mean), st.all_equal & ~single
    return st.mean, st.all_equal


def group_stats(rewards: Tensor | Sequence[float], group_ids: Sequence[Hashable]) -> GroupStats:
    """Mean, unbiased std and size of each trajectory's group, gathered back per trajectory."""
    r = _as_rewards(rewards)
    if len(group_ids) != r.shape[0]:
        raise ValueError(f"{r.shape[0]} rewards but {len(group_ids)} group ids")
    number: dict[Hashable, int] = {}
    index = torch.tensor(
        [number.setdefault(g, len(number)) for g in group_ids], dtype=torch.long, device=r.device
    )
    g = len(number)
    size = torch.zeros(g, dtype=torch.long, device=r.device).index_add_(
        0, index, torch.ones_like(index)
    )
    mean = torch.zeros(g, dtype=r.dtype, device=r.device).index_add_(0, index, r) / size
    dev = r - mean[index]
    sq = torch.zeros(g, dtype=r.dtype, device=r.device).index_add_(0, index, dev * dev)
    var = torch.where(size > 1, sq / (size - 1).clamp(min=1), torch.zeros_like(sq))
    gmax = torch.full((g,), -torch.inf, dtype=r.dtype, device=r.device)
    gmax = gmax.scatter_reduce(0, index, r, reduce="amax")
    gmin = torch.full((g,), torch.inf, dtype=r.dtype, device=r.device)
    gmin = gmin.scatter_reduce(0, index, r, reduce="amin")
    return GroupStats(
        index=index,
        size=size[index],
        mean=mean[index],
        std=var.sqrt()[index],
        all_equal=(gmax == gmin)[index],
    )


# GRPO outcome advantage, DeepSeekMath (Shao et al. 2024, arXiv:2402.03300) eq. in §4.1.2:
#   A_i = (r_i - mean(r_group)) / (std(r_group) + eps)
# Dr.GRPO (Liu et al. 2025, arXiv:2503.20783) drops the std division: A_i = r_i - mean(r_group);
# that is also MemAgent's published setting (norm_by_std=False).
# Matches verl `compute_grpo_outcome_advantage` (std unbiased as torch.std, eps=1e-6), except
# size-1 and all-equal groups are exactly 0 (see module docstring).
def grpo_advantages(
    rewards: Tensor | Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    size1: str = "zero",
) -> Tensor:
    """GRPO advantage of each trajectory relative to the others of its group."""
    r = _as_rewards(rewards)
    st = group_stats(r, group_ids)
    mean, zero = _baseline(st, size1)
    adv = r - mean
    if norm_by_std:
        std = torch.where(st.size == 1, torch.ones_like(st.std), st.std)  # verl: std 1
        adv = adv / (std + eps)
    return torch.where(zero, torch.zeros_like(adv), adv)


# RLOO, leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740):
#   A_i = r_i - 1/(n-1) * sum_{j != i} r_j  =  n/(n-1) * (r_i - mean(r_group))
# Matches verl `compute_rloo_outcome_advantage` for n > 1; size-1 groups get 0 (verl keeps r_i).
def rloo_advantages(
    rewards: Tensor | Sequence[float], group_ids: Sequence[Hashable], *, size1: str = "zero"
) -> Tensor:
    """Reward minus the mean reward of the *other* trajectories of the group."""
    r = _as_rewards(rewards)
    st = group_stats(r, group_ids)
    _, zero = _baseline(st, size1)
    n = st.size.to(r.dtype)
    others_mean = (st.mean * n - r) / (n - 1).clamp(min=1)
    adv = torch.where(st.size == 1, r, r - others_mean)
    return torch.where(zero, torch.zeros_like(adv), adv)


# REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262):
#   c_i = r_i - mean(r_group);  A_i = (c_i - mean_B(c)) / sqrt(var_B(c) + 1e-8)
# i.e. subtract the group mean, then whiten over the whole batch B. verl
# (`compute_reinforce_plus_plus_baseline_outcome_advantage` + `masked_whiten`) whitens over
# *tokens*, so a trajectory weighs in proportion to its response length. Pass `token_counts`
# (response tokens of each trajectory, all its turns together: the training recipe always
# does) to reproduce verl exactly: the advantage is constant over a trajectory's tokens, so
# token-level whitening equals this token-weighted trajectory-level one. Without
# `token_counts` each trajectory counts once. var_B is unbiased (W/(W-1), W = total weight)
# as in verl. Data parallelism: groups are whole on one rank, so the group baseline is local;
# `all_reduce_sum` makes B every rank's trajectories together (weighted sums and W added over
# ranks, then the squared deviations from that mean), so N ranks get one process's numbers.
# The batch statistics are computed in float64.
def reinforce_pp_baseline_advantages(
    rewards: Tensor | Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    token_counts: Tensor | Sequence[int] | None = None,
    size1: str = "zero",
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Group-mean baseline, then batch whitening (trajectory-level or token-weighted);
    `all_reduce_sum` (adds a tensor over data-parallel ranks; every rank calls this): the
    batch is every rank's trajectories."""
    r = _as_rewards(rewards)
    st = group_stats(r, group_ids)
    mean, zero = _baseline(st, size1)
    centred = torch.where(zero, torch.zeros_like(r), r - mean)
    if token_counts is None:
        w = torch.ones_like(r)
    else:
        w = torch.as_tensor(token_counts, device=r.device).to(r.dtype)
        if w.shape != r.shape or (w < 0).any():
            raise ValueError(f"token_counts must be {tuple(r.shape)} non-negative numbers")
    total, batch_mean, sq = reduced_moments(centred, w, all_reduce_sum=all_reduce_sum)
    if total <= 1:
        # One weighted item has no spread: nothing to whiten (its centred value is 0 anyway).
        return torch.zeros_like(r)
    var = float(sq) / total * (total / (total - 1))
    return ((centred.to(torch.float64) - batch_mean) / math.sqrt(var + 1e-8)).to(r.dtype)


# DAPO dynamic sampling (Yu et al. 2025, arXiv:2503.14476 §3.2; the constraint
# 0 < |{o_i : is_equivalent(a, o_i)}| < G of the DAPO objective): keep only groups whose
# rewards are not all equal, since such groups have zero advantage and only dilute the batch.
# Expressed as std > 0, tested exactly as max != min. A group of size 1 is all-equal: dropped.
def dynamic_sampling_keep(
    rewards: Tensor | Sequence[float], group_ids: Sequence[Hashable]
) -> Tensor:
    """Bool mask of trajectories whose group has reward std > 0 (groups of one: never)."""
    return ~group_stats(rewards, group_ids).all_equal


ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")


def compute_advantages(
    estimator: str,
    rewards: Tensor | Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    token_counts: Tensor | Sequence[int],
    norm_by_std: bool = False,
    size1: str = "zero",
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The advantage of every trajectory under ``estimator`` (verl `adv_estimator` names).

    ``token_counts``: response tokens of each trajectory (all its turns), used by the
    token-weighted whitening of REINFORCE++-baseline, as verl. ``all_reduce_sum`` (data
    parallelism, every rank calls this with its own groups): REINFORCE++-baseline whitens
    over every rank's trajectories; the group estimators need nothing of the other ranks.
    """
    if estimator == "grpo":
        return grpo_advantages(rewards, group_ids, norm_by_std=norm_by_std, size1=size1)
    if estimator == "rloo":
        return rloo_advantages(rewards, group_ids, size1=size1)
    if estimator == "reinforce_plus_plus_baseline":
        return reinforce_pp_baseline_advantages(
            rewards, group_ids, token_counts=token_counts, size1=size1,
            all_reduce_sum=all_reduce_sum,
        )
    raise ValueError(f"unknown advantage estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")

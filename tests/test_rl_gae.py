"""GAE, whitening, the clipped value loss and multi-conversation chaining: hand-computed
cases, and parity with verl's formulas on random inputs.

The `verl_*` functions below restate verl's code as read from volcengine/verl @ b178a3cd
(2026-01-29), without importing verl:
- verl/trainer/ppo/core_algos.py: `compute_gae_advantage_return`, `compute_value_loss`,
  `agg_loss` (token-mean);
- verl/utils/torch_functional.py: `masked_mean`, `masked_var`, `masked_whiten`,
  `clip_by_value`.
"""

from __future__ import annotations

import pytest
import torch

from memrl.rl.maths.gae import (
    explained_variance,
    gae_advantages_returns,
    masked_whiten,
    trajectory_gae,
    value_loss,
)
from memrl.rl.maths.losses import agg_loss


# ---- verl's formulas, restated from the files named in the module docstring
def verl_masked_mean(values, mask):
    return (torch.where(mask.bool(), values, 0.0) * mask).sum() / (mask.sum() + 1e-8)


def verl_masked_whiten(values, mask):
    mean = verl_masked_mean(values, mask)
    var = verl_masked_mean((values - mean) ** 2, mask)
    n = mask.sum()
    var = var * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    nextvalues, lastgaelam, reversed_adv = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        reversed_adv.append(lastgaelam)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    return verl_masked_whiten(advantages, response_mask), returns


def verl_value_loss(vpreds, returns, values, response_mask, cliprange_value):
    vpredclipped = torch.max(torch.min(vpreds, values + cliprange_value),
                             values - cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * ((torch.where(response_mask.bool(), clipped, 0.0) * response_mask).sum()
                     / response_mask.sum())
    vf_clipfrac = verl_masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


def random_case(seed, batch=5, seq=19, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(batch, seq, generator=g, dtype=dtype)
    rewards = torch.zeros(batch, seq, dtype=dtype)
    mask = (torch.rand(batch, seq, generator=g) < 0.7).to(dtype)  # holes: observation tokens
    mask[:, 0] = 1
    for b in range(batch):  # outcome reward on each row's last response token (+ noise)
        last = int(mask[b].nonzero().max())
        rewards[b, last] = float(torch.rand(1, generator=g))
    rewards += 0.1 * torch.randn(batch, seq, generator=g, dtype=dtype) * mask  # dense parts
    return rewards, values, mask


# ---- hand-computed cases: values (0.5, 0.2, 0.1), reward 1 on the last of 3 tokens
V = torch.tensor([[0.5, 0.2, 0.1]])
R = torch.tensor([[0.0, 0.0, 1.0]])
M = torch.ones(1, 3)


def test_gae_gamma_1_lam_1_is_return_minus_value():
    adv, ret = gae_advantages_returns(R, V, M, 1.0, 1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.8, 0.9]]), atol=1e-7)
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0]]), atol=1e-7)


def test_gae_by_hand_gamma_09_lam_095():
    # delta2 = 1 - 0.1 = 0.9                 A2 = 0.9
    # delta1 = 0.9*0.1 - 0.2 = -0.11         A1 = -0.11 + 0.855*0.9 = 0.6595
    # delta0 = 0.9*0.2 - 0.5 = -0.32         A0 = -0.32 + 0.855*0.6595 = 0.2438725
    adv, ret = gae_advantages_returns(R, V, M, 0.9, 0.95)
    assert torch.allclose(adv, torch.tensor([[0.2438725, 0.6595, 0.9]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.7438725, 0.8595, 1.0]]), atol=1e-6)


def test_gae_skips_masked_positions():
    # The middle token is an observation: V(next) of token 0 is token 2's value, 0.1.
    # delta0 = 0.9*0.1 - 0.5 = -0.41      A0 = -0.41 + 0.855*0.9 = 0.3595
    values = torch.tensor([[0.5, 9.0, 0.1]])
    adv, _ = gae_advantages_returns(R, values, torch.tensor([[1.0, 0.0, 1.0]]), 0.9, 0.95)
    assert adv[0, 0].item() == pytest.approx(0.3595, abs=1e-6)
    assert adv[0, 2].item() == pytest.approx(0.9, abs=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.99, 0.5), (1.0, 0.0)])
@pytest.mark.parametrize("seed", range(4))
def test_gae_and_whitening_match_verl_on_random_inputs(seed, gamma, lam):
    rewards, values, mask = random_case(seed)
    want_adv, want_ret = verl_gae(rewards, values, mask, gamma, lam)
    adv, ret = gae_advantages_returns(rewards, values, mask, gamma, lam)
    adv = masked_whiten(adv, mask)
    sel = mask.bool()
    assert (adv - want_adv)[sel].abs().max() <= 1e-6
    assert (ret - want_ret)[sel].abs().max() <= 1e-6
    # verl leaves numbers at masked positions too; they are the same
    assert (ret - want_ret).abs().max() <= 1e-6


def test_gamma_1_lam_1_gives_reward_to_go_minus_value_everywhere():
    rewards, values, mask = random_case(7, dtype=torch.float64)
    adv, _ = gae_advantages_returns(rewards, values, mask, 1.0, 1.0)
    to_go = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    sel = mask.bool()
    assert torch.allclose(adv[sel], (to_go - values)[sel], atol=1e-12)


def test_masked_whiten_by_hand():
    x = torch.tensor([[1.0, 100.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    # mean 2, unbiased var 2: (x - 2) / sqrt(2)
    w = masked_whiten(x, mask)
    assert w[0, 0].item() == pytest.approx(-1 / 2**0.5, abs=1e-6)
    assert w[0, 2].item() == pytest.approx(1 / 2**0.5, abs=1e-6)
    assert masked_whiten(x, mask, shift_mean=False)[0, 2].item() == pytest.approx(
        2 + 1 / 2**0.5, abs=1e-6)
    with pytest.raises(ValueError):
        masked_whiten(x, torch.tensor([[1.0, 0.0, 0.0]]))


def test_value_loss_by_hand():
    old, ret, mask = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 0.0]]), torch.ones(1, 2)
    # token 0: V=1 moves 1 away from old 0 → clipped 0.5; losses 1 vs 0.25 → max 1 (unclipped)
    # token 1: V=0.2, old 1 → clipped 0.5; losses 0.04 vs 0.25 → max 0.25 (clipped)
    mat, clipfrac = value_loss(torch.tensor([[1.0, 0.2]]), ret, old, mask, 0.5)
    assert torch.allclose(mat, torch.tensor([[0.5, 0.125]]))
    assert clipfrac.item() == pytest.approx(0.5)
    assert agg_loss(mat, mask, "token-mean").item() == pytest.approx(0.3125)


@pytest.mark.parametrize("seed", range(4))
def test_value_loss_matches_verl_on_random_inputs(seed):
    g = torch.Generator().manual_seed(100 + seed)
    vpreds, ret, old = (torch.randn(6, 13, generator=g) for _ in range(3))
    mask = (torch.rand(6, 13, generator=g) < 0.6).float()
    mask[0, 0] = 1
    want_loss, want_frac = verl_value_loss(vpreds, ret, old, mask, 0.5)
    mat, frac = value_loss(vpreds, ret, old, mask, 0.5)
    assert abs(agg_loss(mat, mask.bool(), "token-mean").item() - want_loss.item()) <= 1e-6
    assert abs(frac.item() - want_frac.item()) <= 1e-6


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(ret, ret.clone(), mask) == pytest.approx(1.0, abs=1e-5)
    # values = the mean: Var(returns - values) = Var(returns) → 0
    mean = torch.full_like(ret, 2.0)
    assert explained_variance(ret, mean, mask) == pytest.approx(0.0, abs=1e-5)


def test_trajectory_gae_chains_conversations_in_turn_order():
    # Trajectory 0: conversations 0 and 2 (values 0.5 | 0.2, 0.1), reward 1 → the hand case
    # above across a conversation boundary. Trajectory 1: conversation 1 alone, reward 0.
    values = [torch.tensor([0.5]), torch.tensor([0.3, 0.4]), torch.tensor([0.2, 0.1])]
    adv, ret = trajectory_gae(values, [0, 1, 0], torch.tensor([1.0, 0.0]), gamma=0.9, lam=0.95)
    assert torch.allclose(adv[0], torch.tensor([0.2438725]), atol=1e-6)
    assert torch.allclose(adv[2], torch.tensor([0.6595, 0.9]), atol=1e-6)
    assert torch.allclose(ret[2], torch.tensor([0.8595, 1.0]), atol=1e-6)
    # trajectory 1: delta1 = -0.4; delta0 = 0.9*0.4 - 0.3 = 0.06, A0 = 0.06 - 0.855*0.4
    assert torch.allclose(adv[1], torch.tensor([0.06 - 0.342, -0.4]), atol=1e-6)


def test_trajectory_gae_equals_verl_on_the_concatenated_sequence():
    """verl's multi-turn agent loop trains one sequence with observation tokens masked out:
    chaining the conversations is the same recurrence."""
    g = torch.Generator().manual_seed(3)
    lens = [3, 4, 2]  # three conversations of one trajectory
    values = [torch.randn(n, generator=g) for n in lens]
    adv, ret = trajectory_gae(values, [0, 0, 0], torch.tensor([0.7]), gamma=0.95, lam=0.9)
    # verl's layout: each conversation followed by 2 observation (masked) tokens
    row_v, row_m = [], []
    for v in values:
        row_v += v.tolist() + [5.0, -5.0]
        row_m += [1.0] * len(v) + [0.0, 0.0]
    vv, mm = torch.tensor([row_v]), torch.tensor([row_m])
    rr = torch.zeros_like(vv)
    rr[0, int(mm[0].nonzero().max())] = 0.7
    want_adv, want_ret = verl_gae(rr, vv, mm, 0.95, 0.9)
    sel = mm[0].bool()
    whitened = masked_whiten(torch.cat(adv).unsqueeze(0), torch.ones(1, sum(lens)))
    assert (whitened[0] - want_adv[0][sel]).abs().max() <= 1e-6
    assert (torch.cat(ret) - want_ret[0][sel]).abs().max() <= 1e-6

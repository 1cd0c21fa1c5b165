"""Advantages against hand-computed values; groups found by id, of sizes 1, 2 and 3 mixed."""

from __future__ import annotations

import math

import pytest
import torch

from memrl.rl.maths.advantages import (
    compute_advantages,
    dynamic_sampling_keep,
    group_stats,
    grpo_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

# Interleaved on purpose: reshaping to a fixed width would group these wrongly.
# group a = [1, 0, 0.5] (size 3), b = [1, 0] (size 2), c = [2] (size 1)
IDS = ["a", "b", "a", "c", "b", "a"]
R = torch.tensor([1.0, 1.0, 0.0, 2.0, 0.0, 0.5], dtype=torch.float64)


def close(actual, expected):
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=1e-12, atol=1e-12
    )


def test_group_stats_by_id():
    st = group_stats(R, IDS)
    close(st.index.to(torch.float64), [0, 1, 0, 2, 1, 0])
    assert st.size.tolist() == [3, 2, 3, 1, 2, 3]
    close(st.mean, [0.5, 0.5, 0.5, 2.0, 0.5, 0.5])
    # unbiased: a: sqrt((.25 + .25 + 0) / 2) = 0.5 ; b: sqrt((.25 + .25) / 1) ; c: 0
    close(st.std, [0.5, math.sqrt(0.5), 0.5, 0.0, math.sqrt(0.5), 0.5])
    assert st.std[0] == torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64).std()
    assert st.all_equal.tolist() == [False, False, False, True, False, False]


def test_grpo_with_std():
    eps = 1e-6
    a = 0.5 / (0.5 + eps)
    b = 0.5 / (math.sqrt(0.5) + eps)
    close(grpo_advantages(R, IDS), [a, b, -a, 0.0, -b, 0.0])


def test_grpo_eps_is_used():
    a = grpo_advantages(R, IDS, eps=0.5)
    close(a[0], 0.5 / (0.5 + 0.5))


def test_grpo_mean_centred_only():
    close(grpo_advantages(R, IDS, norm_by_std=False), [0.5, 0.5, -0.5, 0.0, -0.5, 0.0])


def test_grpo_int_group_ids_and_list_rewards():
    adv = grpo_advantages([1, 0, 3], [7, 7, 9], norm_by_std=False)
    assert adv.dtype == torch.float32
    assert adv.tolist() == [0.5, -0.5, 0.0]


def test_equal_rewards_are_exactly_zero():
    # 0.1 is not representable: r - mean can leave a residue that / (std + eps) would magnify.
    r = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.3], dtype=torch.float32)
    ids = ["q", "q", "q", "p", "p"]
    for adv in (
        grpo_advantages(r, ids),
        grpo_advantages(r, ids, norm_by_std=False),
        rloo_advantages(r, ids),
        reinforce_pp_baseline_advantages(r, ids),
    ):
        assert adv.tolist() == [0.0] * 5


def test_size_one_group_is_zero():
    assert grpo_advantages([5.0], ["x"]).tolist() == [0.0]
    assert rloo_advantages([5.0], ["x"]).tolist() == [0.0]
    assert reinforce_pp_baseline_advantages([5.0], ["x"]).tolist() == [0.0]


def test_rloo():
    # a: 1 - (0 + .5)/2 = .75 ; 0 - (1 + .5)/2 = -.75 ; .5 - (1 + 0)/2 = 0
    # b: 1 - 0 = 1 ; 0 - 1 = -1 ; c: size 1 -> 0
    close(rloo_advantages(R, IDS), [0.75, 1.0, -0.75, 0.0, -1.0, 0.0])


def test_rloo_is_scaled_grpo_mean():
    # r_i - mean_others = n/(n-1) (r_i - mean)
    g = grpo_advantages(R, IDS, norm_by_std=False)
    n = torch.tensor([3, 2, 3, 1, 2, 3], dtype=torch.float64)
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.zeros_like(n))
    close(rloo_advantages(R, IDS), g * scale)


def test_reinforce_pp_baseline_trajectory_level():
    # centred: [.5, .5, -.5, 0, -.5, 0] (batch order); batch mean 0;
    # unbiased var = 4 * .25 / 5 = 0.2
    centred = torch.tensor([0.5, 0.5, -0.5, 0.0, -0.5, 0.0], dtype=torch.float64)
    close(reinforce_pp_baseline_advantages(R, IDS), centred / math.sqrt(0.2 + 1e-8))


def test_reinforce_pp_baseline_token_weighted_matches_token_level_whitening():
    counts = [2, 1, 1, 1, 1, 0]
    # Token level (verl masked_whiten): centred values repeated per token.
    tokens = [0.5, 0.5, 0.5, -0.5, 0.0, -0.5]
    mean = sum(tokens) / 6  # 1/12
    var = sum((t - mean) ** 2 for t in tokens) / 5  # 174/720
    assert var == pytest.approx(174 / 720)
    centred = torch.tensor([0.5, 0.5, -0.5, 0.0, -0.5, 0.0], dtype=torch.float64)
    expected = (centred - mean) / math.sqrt(var + 1e-8)
    close(reinforce_pp_baseline_advantages(R, IDS, token_counts=counts), expected)


def test_dynamic_sampling_keep():
    r = [1.0, 1.0, 0.0, 2.0, 0.0, 0.5, 1.0, 1.0]
    ids = ["a", "b", "a", "c", "b", "a", "d", "d"]
    # a varied, b varied, c size 1 (dropped), d all equal (dropped)
    assert dynamic_sampling_keep(r, ids).tolist() == [True, True, True, False, True, True,
                                                       False, False]


@pytest.mark.parametrize(
    "rewards, ids",
    [
        ([1.0, 2.0], ["a"]),
        ([[1.0, 2.0]], ["a"]),
        ([1.0, float("nan")], ["a", "a"]),
        ([1.0, float("inf")], ["a", "a"]),
    ],
)
def test_bad_inputs(rewards, ids):
    with pytest.raises(ValueError):
        grpo_advantages(rewards, ids)


def test_bad_token_counts():
    with pytest.raises(ValueError):
        reinforce_pp_baseline_advantages(R, IDS, token_counts=[1, 2])


# ---------------------------------------------------------------- groups of one, as verl
def test_size1_raw_reward_is_verls_behaviour():
    """verl compute_grpo_outcome_advantage: a group of one has mean 0, std 1, so its
    advantage is r / (1 + eps) (std division) or r; RLOO keeps r. Others are unchanged."""
    zero = grpo_advantages(R, IDS)
    raw = grpo_advantages(R, IDS, size1="raw_reward")
    assert zero[3] == 0.0 and raw[3].item() == pytest.approx(2.0 / (1 + 1e-6), rel=1e-12)
    close(torch.cat([raw[:3], raw[4:]]), torch.cat([zero[:3], zero[4:]]))
    assert grpo_advantages(R, IDS, norm_by_std=False, size1="raw_reward")[3].item() == 2.0
    assert rloo_advantages(R, IDS, size1="raw_reward")[3].item() == 2.0
    assert rloo_advantages(R, IDS)[3].item() == 0.0
    with pytest.raises(ValueError, match="size1"):
        grpo_advantages(R, IDS, size1="raw")


def test_size1_raw_reward_in_reinforce_pp_uses_mean_zero():
    # verl: a group of one has mean 0, so its centred value is r = 2 before whitening.
    centred = torch.tensor([0.5, 0.5, -0.5, 2.0, -0.5, 0.0], dtype=torch.float64)
    mean = centred.mean()
    var = ((centred - mean) ** 2).sum() / 5
    expected = (centred - mean) / torch.sqrt(var + 1e-8)
    close(reinforce_pp_baseline_advantages(R, IDS, size1="raw_reward"), expected)


def verl_reinforce_pp_baseline(rewards, ids, lengths, epsilon=1e-6):
    """verl compute_reinforce_plus_plus_baseline_outcome_advantage + masked_whiten, on a
    (rows, max_len) token matrix: every row is one trajectory's response tokens."""
    scores = rewards.clone()
    by_id = {}
    for i, g in enumerate(ids):
        by_id.setdefault(g, []).append(scores[i])
    means = {g: (torch.tensor(0.0) if len(v) == 1 else torch.mean(torch.stack(v)))
             for g, v in by_id.items()}
    scores = torch.stack([scores[i] - means[g] for i, g in enumerate(ids)])
    mask = torch.zeros(len(ids), max(lengths), dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    values = scores.unsqueeze(-1) * mask
    m = (values * mask).sum() / mask.sum()
    var = (((values - m) ** 2) * mask).sum() / mask.sum()
    var = var * mask.sum() / (mask.sum() - 1)
    return ((values - m) * torch.rsqrt(var + 1e-8) * mask)[:, 0]


def test_compute_advantages_reinforce_pp_whitens_over_tokens_like_verl():
    """The recipe passes each trajectory's response tokens over all its turns; the result
    equals verl's token-level whitening (and differs from the trajectory-level one)."""
    g = torch.Generator().manual_seed(3)
    ids = [f"q{i // 4}" for i in range(16)]
    rewards = torch.rand(16, generator=g, dtype=torch.float64).round()
    lengths = torch.randint(1, 40, (16,), generator=g).tolist()
    ours = compute_advantages(
        "reinforce_plus_plus_baseline", rewards, ids, token_counts=lengths, size1="raw_reward"
    )
    ref = verl_reinforce_pp_baseline(rewards, ids, lengths)
    nonzero = ref != 0
    close(ours[nonzero], ref[nonzero])
    per_traj = reinforce_pp_baseline_advantages(rewards, ids)
    assert (per_traj - ours).abs().max() > 1e-3


def test_compute_advantages_dispatch():
    close(compute_advantages("grpo", R, IDS, token_counts=[1] * 6, norm_by_std=True),
          grpo_advantages(R, IDS))
    close(compute_advantages("rloo", R, IDS, token_counts=[1] * 6), rloo_advantages(R, IDS))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("ppo", R, IDS, token_counts=[1] * 6)

"""Losses against hand-computed values, and exact micro-batch additivity for every mode."""

from __future__ import annotations

import math

import pytest
import torch

from memrl.errors import MemrlInputError
from memrl.rl.maths.losses import (
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    kl_penalty_reward,
    logprobs_from_logits,
    loss_norm,
    masked_mean,
    policy_loss,
)

F64 = torch.float64
SCALE = 6.0  # seq-mean-token-sum-norm's constant in these tests


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def close(actual, expected, tol=1e-12):
    torch.testing.assert_close(
        actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=tol, atol=tol
    )


# ---------------------------------------------------------------- aggregation

L23 = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M23 = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
    ],
)
def test_agg_modes_2x3(mode, expected):
    close(agg_loss(L23, M23, mode), expected)


def test_traj_mean_2x3():
    # both rows one trajectory: its token mean (1 + 2 + 4) / 3
    close(agg_loss(L23, M23, "traj-mean-token-mean", traj_ids=torch.tensor([5, 5])), 7 / 3)
    # two trajectories: (1.5 + 4) / 2
    close(agg_loss(L23, M23, "traj-mean-token-mean", traj_ids=torch.tensor([5, 9])), 2.75)


def test_traj_mean_3_rows():
    loss = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # traj 0 = rows 0, 1: tokens 1, 2, 4 -> 7/3 ; traj 1 = row 2: 8 ; mean (7/3 + 8) / 2
    close(agg_loss(loss, mask, "traj-mean-token-mean", traj_ids=torch.tensor([0, 0, 1])), 31 / 6)
    # per conversation instead: (1.5 + 4 + 8) / 3
    close(agg_loss(loss, mask, "seq-mean-token-mean"), 13.5 / 3)


def test_bool_mask_and_masked_nonfinite():
    loss = t([[1.0, math.inf], [2.0, math.nan]])
    mask = torch.tensor([[True, False], [True, False]])
    for mode in LOSS_AGG_MODES:
        out = agg_loss(loss, mask, mode, traj_ids=torch.tensor([0, 1]), scale_factor=SCALE)
        assert torch.isfinite(out)
    close(agg_loss(loss, mask, "token-mean"), 1.5)


def test_fully_masked_row_is_not_counted():
    mask = t([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    close(agg_loss(L23, mask, "seq-mean-token-mean"), 1.5)
    close(agg_loss(L23, mask, "seq-mean-token-sum"), 3.0)
    close(agg_loss(L23, mask, "traj-mean-token-mean", traj_ids=torch.tensor([0, 1])), 1.5)


def test_empty_mask_gives_zero_not_nan():
    mask = torch.zeros(2, 3, dtype=F64)
    for mode in LOSS_AGG_MODES:
        got = agg_loss(L23, mask, mode, traj_ids=torch.tensor([0, 1]), scale_factor=SCALE)
        assert got.item() == 0.0


def test_loss_norm_by_hand():
    n = torch.tensor([3, 0, 2])
    traj = torch.tensor([4, 4, 1])

    def norm(mode, **kw):
        got = loss_norm(n, mode, **kw)
        return got.row_divisor.tolist(), got.divisor

    assert norm("token-mean") == ([1, 1, 1], 5)
    assert norm("seq-mean-token-sum") == ([1, 1, 1], 2)
    assert norm("seq-mean-token-mean") == ([3, 1, 2], 2)
    assert norm("seq-mean-token-sum-norm", scale_factor=16) == ([1, 1, 1], 16)
    assert norm("traj-mean-token-mean", traj_ids=traj) == ([3, 3, 2], 2)
    assert norm("traj-mean-token-mean", traj_ids=torch.tensor([1, 1, 1])) == ([5, 5, 5], 1)
    assert not loss_norm(n, "seq-mean-token-sum-norm", scale_factor=16).global_count
    with pytest.raises(MemrlInputError, match="loss_scale_factor"):
        loss_norm(n, "seq-mean-token-sum-norm")


def test_agg_errors():
    with pytest.raises(MemrlInputError):
        agg_loss(L23, M23, "token-sum")
    with pytest.raises(ValueError):
        agg_loss(L23, M23, "traj-mean-token-mean")  # no traj_ids
    with pytest.raises(ValueError):
        agg_loss(L23, M23[:1], "token-mean")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_sum_to_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    rows, seq = 7, 6
    loss = torch.randn(rows, seq, generator=g, dtype=F64, requires_grad=True)
    lengths = [6, 2, 0, 4, 1, 5, 3]  # right-padded masks, one row with no loss token
    mask = torch.zeros(rows, seq, dtype=F64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    traj = torch.tensor([0, 0, 1, 2, 1, 2, 2])  # trajectories split across micro-batches

    full = agg_loss(loss, mask, mode, traj_ids=traj, scale_factor=SCALE)
    (full_grad,) = torch.autograd.grad(full, loss)

    norm = loss_norm(mask.sum(-1), mode, traj_ids=traj, scale_factor=SCALE)
    micro = [[0, 4], [1, 2, 5], [3], [6]]
    total = torch.zeros((), dtype=F64)
    for idx in micro:
        width = max(lengths[i] for i in idx) or 1  # each micro-batch padded to its own width
        part = agg_loss(loss[idx, :width], mask[idx, :width], mode, norm=norm.rows(idx))
        part.backward()
        total = total + part.detach()
    close(total, full)
    close(loss.grad, full_grad)


# ---------------------------------------------------------------- policy loss

def one_token(logratio: float, adv: float, **kw):
    """policy_loss on a single token with log(new/old) = logratio; also the log_prob grad."""
    lp = t([[logratio]]).requires_grad_(True)
    loss, metrics = policy_loss(lp, t([[0.0]]), t([[adv]]), t([[1.0]]), **kw)
    loss.backward()
    return loss.item(), metrics, lp.grad.item()


def test_positive_advantage_clipped_high():
    # r = e^.5 = 1.6487 > 1 + .28: max(-1.6487, -1.28) = -1.28, no gradient
    loss, m, grad = one_token(0.5, 1.0, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert loss == pytest.approx(-1.28)
    assert m["pg_clipfrac"].item() == 1.0
    assert grad == 0.0


def test_positive_advantage_below_low_is_not_clipped():
    # r = e^-.5 = .6065 < .8: max(-.6065, -.8) = -.6065; d/dx(-e^x) = -.6065
    loss, m, grad = one_token(-0.5, 1.0)
    assert loss == pytest.approx(-math.exp(-0.5))
    assert m["pg_clipfrac"].item() == 0.0
    assert grad == pytest.approx(-math.exp(-0.5))


def test_negative_advantage_clipped_low():
    # r = .6065 < .8, A = -1: max(.6065, .8) = .8, no gradient
    loss, m, grad = one_token(-0.5, -1.0)
    assert loss == pytest.approx(0.8)
    assert m["pg_clipfrac"].item() == 1.0
    assert grad == 0.0


def test_negative_advantage_above_high_is_not_clipped():
    # r = 1.6487 > 1.2, A = -1: max(1.6487, 1.2) = 1.6487
    loss, m, grad = one_token(0.5, -1.0)
    assert loss == pytest.approx(math.exp(0.5))
    assert m["pg_clipfrac"].item() == 0.0
    assert grad == pytest.approx(math.exp(0.5))


def test_clip_higher():
    # r = e^.24 = 1.2712: clipped at 1.2 with eps_high .2, free with eps_high .28
    assert one_token(0.24, 1.0)[0] == pytest.approx(-1.2)
    assert one_token(0.24, 1.0, clip_ratio_high=0.28)[0] == pytest.approx(-math.exp(0.24))
    # the low side is governed by clip_ratio_low alone: r = e^-.25 = .7788, A < 0
    for high in (0.2, 0.28):
        assert one_token(-0.25, -1.0, clip_ratio_high=high)[0] == pytest.approx(0.8)
        assert one_token(-0.25, -1.0, clip_ratio_low=0.3, clip_ratio_high=high)[
            0
        ] == pytest.approx(math.exp(-0.25))


def test_dual_clip():
    # A = -1, r = e^2 = 7.389: plain PPO loss 7.389, dual clip bounds it at c * |A| = 3
    loss, m, grad = one_token(2.0, -1.0, clip_ratio_c=None)
    assert loss == pytest.approx(math.exp(2.0))
    assert m["pg_clipfrac_lower"].item() == 0.0
    loss, m, grad = one_token(2.0, -1.0, clip_ratio_c=3.0)
    assert loss == pytest.approx(3.0)
    assert m["pg_clipfrac_lower"].item() == 1.0
    assert grad == 0.0
    # r = e^.6931 = 2 < 3: not bounded
    loss, m, _ = one_token(math.log(2.0), -1.0, clip_ratio_c=3.0)
    assert loss == pytest.approx(2.0)
    assert m["pg_clipfrac_lower"].item() == 0.0
    # positive advantages are never dual-clipped
    loss, m, _ = one_token(2.0, 1.0, clip_ratio_c=3.0)
    assert loss == pytest.approx(-1.2)
    assert m["pg_clipfrac_lower"].item() == 0.0


def test_policy_loss_batch_metrics_and_mask():
    # row 0: the four single-token cases; row 1: one masked token with a huge ratio
    logp = t([[0.5, -0.5, -0.5, 0.5], [15.0, 0.0, 0.0, 0.0]])
    old = torch.zeros(2, 4, dtype=F64)
    adv = t([[1.0, 1.0, -1.0, -1.0], [-1.0, 0.0, 0.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    loss, m = policy_loss(logp, old, adv, mask, clip_ratio_c=3.0)
    e = math.exp(0.5)
    # per token: -1.2, -1/e, .8, e
    assert loss.item() == pytest.approx((-1.2 - 1 / e + 0.8 + e) / 4)
    assert m["pg_clipfrac"].item() == 0.5
    assert m["ppo_kl"].item() == pytest.approx(0.0)  # mean(old - new) = mean(-.5, .5, .5, -.5)
    assert m["pg_clipfrac_lower"].item() == 0.0
    assert all(not v.requires_grad for v in m.values())


def test_ppo_kl_metric():
    _, m, _ = one_token(-0.3, 1.0)
    assert m["ppo_kl"].item() == pytest.approx(0.3)


def test_row_advantages_broadcast():
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(3, 4, generator=g, dtype=F64) * 0.3
    old = torch.randn(3, 4, generator=g, dtype=F64) * 0.3
    adv = t([1.0, -0.5, 2.0])
    mask = torch.ones(3, 4, dtype=F64)
    a, _ = policy_loss(logp, old, adv, mask, loss_agg_mode="seq-mean-token-mean")
    b, _ = policy_loss(logp, old, adv[:, None].expand(3, 4), mask,
                       loss_agg_mode="seq-mean-token-mean")
    close(a, b)


def test_policy_loss_ratio_one_is_minus_mean_advantage():
    logp = torch.zeros(2, 3, dtype=F64)
    adv = t([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    loss, _ = policy_loss(logp, logp, adv, M23)
    close(loss, -(2 + 2 - 1) / 3)


def test_policy_loss_bad_config():
    x = torch.zeros(1, 1)
    with pytest.raises(MemrlInputError):
        policy_loss(x, x, x, x, clip_ratio_c=1.0)
    with pytest.raises(MemrlInputError):
        policy_loss(x, x, x, x, clip_ratio_low=-0.1)
    with pytest.raises(MemrlInputError):
        policy_loss(x, x, x, x, loss_agg_mode="mean")


# ---------------------------------------------------------------- KL

K3_POS = math.exp(-0.5) + 0.5 - 1  # 0.10653065971263342
K3_NEG = math.exp(0.5) - 0.5 - 1  # 0.14872127070012819


@pytest.mark.parametrize(
    "kind, at_pos, at_neg",
    [
        ("k1", 0.5, -0.5),
        ("kl", 0.5, -0.5),
        ("abs", 0.5, 0.5),
        ("k2", 0.125, 0.125),
        ("mse", 0.125, 0.125),
        ("k3", K3_POS, K3_NEG),
        ("low_var_kl", K3_POS, K3_NEG),
    ],
)
def test_kl_estimators_by_hand(kind, at_pos, at_neg):
    # log_prob - ref_log_prob = +0.5 and -0.5
    out = kl_penalty(t([0.5, -0.5, 0.0]), t([0.0, 0.0, 0.0]), kind)
    close(out, [at_pos, at_neg, 0.0])
    assert K3_POS == pytest.approx(0.10653066, abs=1e-8)


def test_k3_clamps():
    # log ratio 30 -> clamped to 20 -> e^20 - 21 -> clamped to 10 ; -30 -> -20 -> 19 -> 10
    out = kl_penalty(t([-30.0, 30.0, -1000.0]), t([0.0, 0.0, 0.0]), "low_var_kl")
    assert out.tolist() == [10.0, 10.0, 10.0]
    # inside the clamp: log(ref/pi) = 2 -> e^2 - 3
    close(kl_penalty(t([0.0]), t([2.0]), "k3"), [math.exp(2) - 3])


def test_kl_unknown_kind():
    with pytest.raises(MemrlInputError):
        kl_penalty(t([0.0]), t([0.0]), "full")


def test_kl_penalty_reward():
    rewards = t([1.0, 0.0])
    ref = torch.zeros(3, 2, dtype=F64)
    logp = t([[0.5, 0.5], [0.2, 0.1], [-0.1, 0.3]])
    mask = t([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    traj_index = torch.tensor([0, 1, 0])
    # traj 0: 0.5 + (-0.1 + 0.3) = 0.7 ; traj 1: 0.2 + 0.1 = 0.3
    out = kl_penalty_reward(rewards, logp, ref, mask, traj_index, coef=0.1, kind="k1")
    close(out, [1.0 - 0.07, 0.0 - 0.03])


# ---------------------------------------------------------------- entropy, log-probs

def test_entropy_by_hand():
    logits = t([[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -math.inf, -math.inf],
                [1000.0, 0.0, 0.0, 0.0]])
    h = entropy_from_logits(logits)
    # uniform over 4 ; p = (.75, .25) ; almost deterministic
    close(h, [math.log(4.0), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), 0.0])


def test_entropy_masked_vocab_gradient_is_finite():
    logits = torch.tensor([[0.0, -math.inf, 1.0]], requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_chunks_and_bf16():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 11, generator=g)
    full = entropy_from_logits(logits, chunk_rows=None)
    assert full.shape == (2, 5)
    torch.testing.assert_close(entropy_from_logits(logits, chunk_rows=3), full)
    low = entropy_from_logits(logits.bfloat16())
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, full, rtol=2e-2, atol=2e-2)


def test_logprobs_by_hand():
    logits = t([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])
    close(logprobs_from_logits(logits, torch.tensor([0, 1])), [math.log(0.75), math.log(0.25)])


def test_logprobs_match_log_softmax_gather_with_grad():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 13, generator=g, dtype=F64, requires_grad=True)
    labels = torch.randint(0, 13, (2, 5), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    (ref_grad,) = torch.autograd.grad(ref.sum(), logits)
    out = logprobs_from_logits(logits, labels, chunk_rows=3)  # 10 rows: chunks 3, 3, 3, 1
    close(out, ref)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    close(grad, ref_grad)
    low = logprobs_from_logits(logits.detach().bfloat16(), labels)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, ref.float(), rtol=3e-2, atol=3e-2)


def test_logprobs_shape_check():
    with pytest.raises(ValueError):
        logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_masked_mean():
    close(masked_mean(t([1.0, 2.0, 10.0]), t([1.0, 1.0, 0.0])), 1.5)
    assert masked_mean(t([1.0]), t([0.0])).item() == 0.0


# ---------------------------------------------------------------- equal to verl's formulas
# verl/trainer/ppo/core_algos.py `agg_loss`, restated term by term as the reference
# (single micro-batch: one call over the whole batch).
def verl_agg_loss(loss_mat, loss_mask, mode, scale_factor=None):
    loss_mask = loss_mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    if mode == "seq-mean-token-sum":
        return torch.mean(seq_losses)
    if mode == "seq-mean-token-mean":
        return torch.mean(seq_losses / torch.sum(loss_mask, dim=-1))
    assert mode == "seq-mean-token-sum-norm"
    return torch.sum(seq_losses) / (scale_factor or loss_mask.shape[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_agg_loss_equals_verl_on_random_inputs(mode, dtype):
    """Rows all with loss tokens (where verl and memrl agree by definition), large values,
    half precision: the divisions are done in the loss dtype in verl's order."""
    g = torch.Generator().manual_seed(1)
    for trial in range(20):
        rows, seq = 3 + trial % 5, 5 + trial
        loss = torch.randn(rows, seq, generator=g) * 1e4
        if dtype == torch.bfloat16:  # no cancellation: bf16 sums of mixed signs are noise
            loss = loss.abs()
        loss = loss.to(dtype)
        mask = torch.rand(rows, seq, generator=g) < 0.7
        mask[:, 0] = True
        ours = agg_loss(loss, mask, mode, scale_factor=float(seq))
        ref = verl_agg_loss(loss, mask, mode, scale_factor=float(seq))
        assert ours.dtype == ref.dtype == dtype
        tol = 1e-6 if dtype == torch.float32 else 8e-3
        torch.testing.assert_close(ours.float(), ref.float(), rtol=tol, atol=0)


def test_seq_mean_token_sum_divides_in_the_loss_dtype():
    """Three rows of 1e6: the mean is 1e6 exactly. Weights rounded to the loss dtype first
    (the old w = 1/S in float64, cast) give 1e6 * 3 * bf16(1/3) = 1.0015e6, 0.15% off."""
    loss = torch.full((3, 1), 1e6, dtype=torch.bfloat16)
    mask = torch.ones(3, 1, dtype=torch.bool)
    got = agg_loss(loss, mask, "seq-mean-token-sum")
    assert got.item() == verl_agg_loss(loss, mask, "seq-mean-token-sum").item()
    assert got.item() == torch.tensor(1e6, dtype=torch.bfloat16).item()


def test_dual_clip_is_on_by_default_as_in_verl():
    """verl compute_policy_loss defaults clip_ratio_c=3.0: a negative advantage with a huge
    ratio costs at most -A * 3."""
    lp = t([[math.log(10.0)]])
    loss, metrics = policy_loss(lp, t([[0.0]]), t([[-1.0]]), t([[1.0]]))
    close(loss, 3.0)
    assert metrics["pg_clipfrac_lower"].item() == 1.0


def test_linear_logprobs_equals_the_plain_path_and_passes_gradcheck():
    from memrl.rl.maths.losses import linear_logprobs

    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, dtype=F64, requires_grad=True)
    w = torch.randn(50, 16, generator=g, dtype=F64, requires_grad=True)
    y = torch.randint(0, 50, (37,), generator=g)
    lp, ent = linear_logprobs(h, w, y, temperature=0.7, chunk_rows=8)
    z = h @ w.t()
    close(lp, logprobs_from_logits(z, y, temperature=0.7), tol=1e-12)
    close(ent, entropy_from_logits(z, temperature=0.7), tol=1e-10)
    assert not ent.requires_grad
    assert torch.autograd.gradcheck(
        lambda a, b: linear_logprobs(a, b, y, temperature=0.7, chunk_rows=8)[0], (h, w)
    )
    assert torch.autograd.gradcheck(
        lambda a, b: linear_logprobs(a, b, y, chunk_rows=5, with_entropy=False)[0], (h, w)
    )
    alone, none = linear_logprobs(h, w, y, temperature=0.7, chunk_rows=8, with_entropy=False)
    assert none is None
    close(alone, lp, tol=1e-12)
    with pytest.raises(ValueError):
        linear_logprobs(h, w, y[:3])


def test_linear_logprobs_entropy_of_peaked_rows_is_accurate_in_float32():
    """Entropy as log sum(e) - sum(e z) / sum(e) of the max-shifted logits: no cancellation
    between logsumexp and sum(p z) on nearly one-hot rows (float64 reference)."""
    from memrl.rl.maths.losses import linear_logprobs

    g = torch.Generator().manual_seed(2)
    h = torch.randn(64, 16, generator=g) * 8.0
    w = torch.randn(400, 16, generator=g)
    y = torch.randint(0, 400, (64,), generator=g)
    _, ent = linear_logprobs(h, w, y, chunk_rows=16)
    exact = entropy_from_logits((h @ w.t()).double())  # of the same float32 logits
    assert exact.min() < 1e-3  # some rows are nearly one-hot
    assert (ent.double() - exact).abs().max() < 1e-6
    assert ent.min() >= 0


def test_linear_logprobs_backward_runs_in_the_forwards_autocast_dtype():
    """Under bfloat16 autocast the fused backward gives the plain head(hidden) path's
    gradients under the same autocast (its matrix products in bfloat16, from the forward's
    logits), not float32 ones: the hidden states' gradient 10x closer to the plain path's
    than to float32's; the weight's within one bfloat16 rounding of the plain path's (which
    rounds its one product to bfloat16, where the fused path sums chunks in float32)."""
    from memrl.rl.maths.losses import linear_logprobs

    g = torch.Generator().manual_seed(1)
    h0 = torch.randn(70, 32, generator=g)
    w0 = torch.randn(300, 32, generator=g) * 0.3
    y = torch.randint(0, 300, (70,), generator=g)
    upstream = torch.linspace(-1, 1, 70)

    def grads(fused: bool, autocast: bool) -> list[torch.Tensor]:
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if fused:
                lp = linear_logprobs(h, w, y, temperature=0.9, chunk_rows=16)[0]
            else:
                lp = logprobs_from_logits(h @ w.t(), y, temperature=0.9)
        (lp * upstream).sum().backward()
        return [h.grad, w.grad]

    (fh, fw), (ph, pw), (eh, ew) = grads(True, True), grads(False, True), grads(False, False)
    assert fh.dtype == fw.dtype == torch.float32
    assert (fh - ph).norm() < (fh - eh).norm() / 10
    assert (fw - pw).norm() < 2**-7 * pw.norm()
    for f, e in ((fh, eh), (fw, ew)):
        torch.testing.assert_close(f, e, rtol=0.1, atol=0.05)

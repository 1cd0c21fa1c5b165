"""Training–inference mismatch and truncated importance sampling: hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from memrl.errors import MemrlInputError
from memrl.rl.config import RLConfig
from memrl.rl.maths.correction import (
    RolloutMismatchError,
    check_logprob_mismatch,
    logprob_mismatch,
    rollout_is_weights,
)
from memrl.rl.maths.losses import policy_loss

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, 0.0, 0.0]])
ROLLOUT = torch.tensor([[-1.5, -1.0, -0.5], [-3.0, 9.0, 9.0]])  # 9.0: padding, masked
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def test_mismatch_mean_and_max_over_all_tokens():
    engine = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
    trainer = [torch.tensor([-1.1, -2.0]), torch.tensor([-0.2])]
    got = logprob_mismatch(engine, trainer)
    assert got["mean"] == pytest.approx((0.1 + 0.0 + 0.3) / 3)
    assert got["max"] == pytest.approx(0.3)
    assert logprob_mismatch([], []) == {"mean": 0.0, "max": 0.0}


def test_token_level_weights_are_capped_ratios():
    w = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", threshold=2.0)
    # row 0: log-ratios 0.5, -1, 0; row 1: 2 → e^2 = 7.39, capped at 2; padding 0.
    want = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(w, want)


def test_sequence_level_weights_share_the_product_of_ratios():
    w = rollout_is_weights(OLD, ROLLOUT, MASK, level="sequence", threshold=2.0)
    # row 0: 0.5 - 1 + 0 = -0.5 for every token; row 1: 2 → capped at 2.
    want = torch.tensor([[math.exp(-0.5)] * 3, [2.0, 0.0, 0.0]])
    torch.testing.assert_close(w, want)


def test_weights_scale_the_policy_gradient_loss():
    # log_prob = old: ratio 1, advantage 1 → each token's loss is -1, times its weight.
    w = rollout_is_weights(OLD, ROLLOUT, MASK, level="token", threshold=2.0)
    loss, _ = policy_loss(OLD, OLD, torch.ones(2), MASK, weights=w)
    assert float(loss) == pytest.approx(-(math.exp(0.5) + math.exp(-1.0) + 1.0 + 2.0) / 4)
    plain, _ = policy_loss(OLD, OLD, torch.ones(2), MASK)
    assert float(plain) == pytest.approx(-1.0)


def test_bad_settings_are_user_errors():
    with pytest.raises(MemrlInputError, match="rollout_is"):
        rollout_is_weights(OLD, ROLLOUT, MASK, level="turn", threshold=2.0)
    with pytest.raises(MemrlInputError, match="rollout_is_threshold"):
        rollout_is_weights(OLD, ROLLOUT, MASK, level="token", threshold=0.0)
    with pytest.raises(ValueError, match="use one or the other"):
        RLConfig(rollout_is="token", use_rollout_logprobs=True)


def test_mismatch_guard_stops_above_the_limit_only():
    check_logprob_mismatch(0.5, 1.0, engine="vllm", step=3)
    check_logprob_mismatch(1.0, 1.0, engine="vllm", step=3)  # at the limit: goes on
    check_logprob_mismatch(float("inf"), None, engine="vllm", step=3)  # no limit
    with pytest.raises(RolloutMismatchError) as info:
        check_logprob_mismatch(3.5, 1.0, engine="openai", step=7)
    text = str(info.value)
    assert "\n" not in text and text.startswith("rollout engine openai: ")
    assert "by up to 3.5 at step 7, above rollout.max_logprob_diff=1" in text
    with pytest.raises(RolloutMismatchError, match="by up to nan at step 1"):
        check_logprob_mismatch(float("nan"), 1.0, engine="hf", step=1)

"""memrl.rl: the math of RL training (advantages, losses, KL) and sample/batch plumbing.

Pure functions over tensors, kept apart from the loop that drives them.
"""

from memrl.rl.advantages import (
    GroupStats,
    dynamic_sampling_keep,
    group_stats,
    grpo_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from memrl.rl.losses import (
    KL_KINDS,
    LOSS_AGG_MODES,
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    kl_penalty_reward,
    logprobs_from_logits,
    loss_row_weights,
    masked_mean,
    policy_loss,
)
from memrl.rl.samples import (
    OVERLONG_MODES,
    Sample,
    collate,
    pack_token_budget,
    sample_loss_weights,
    split_mini_batches,
    trajectories_to_samples,
)

__all__ = [
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "OVERLONG_MODES",
    "GroupStats",
    "Sample",
    "agg_loss",
    "collate",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "group_stats",
    "grpo_advantages",
    "kl_penalty",
    "kl_penalty_reward",
    "logprobs_from_logits",
    "loss_row_weights",
    "masked_mean",
    "pack_token_budget",
    "policy_loss",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "sample_loss_weights",
    "split_mini_batches",
    "trajectories_to_samples",
]

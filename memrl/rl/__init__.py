"""memrl.rl: the maths of RL training and the pieces a recipe composes.

- `advantages`, `losses`: pure functions over tensors (verl's formulas, with tests).
- `batch`: `RolloutBatch`, the typed batch of one step; `collate`, `pack_token_budget`.
- `actor`: `Actor` (log-probs + PPO update) and `Reference`.
- `rollout`: the question stream and dynamic sampling (`collect_groups`).
- `checkpoint`: atomic checkpoints, resume, export.

It never imports an agent, a task or an engine implementation: it sees `Trajectory`s.
"""

from memrl.rl.advantages import (
    ESTIMATORS,
    SIZE1_MODES,
    GroupStats,
    compute_advantages,
    dynamic_sampling_keep,
    group_stats,
    grpo_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from memrl.rl.batch import OVERLONG_MODES, RolloutBatch, Sample, collate, pack_token_budget
from memrl.rl.losses import (
    KL_KINDS,
    LOSS_AGG_MODES,
    LossNorm,
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    kl_penalty_reward,
    logprobs_from_logits,
    loss_norm,
    masked_mean,
    policy_loss,
)

__all__ = [
    "ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "OVERLONG_MODES",
    "SIZE1_MODES",
    "GroupStats",
    "LossNorm",
    "RolloutBatch",
    "Sample",
    "agg_loss",
    "collate",
    "compute_advantages",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "group_stats",
    "grpo_advantages",
    "kl_penalty",
    "kl_penalty_reward",
    "logprobs_from_logits",
    "loss_norm",
    "masked_mean",
    "pack_token_budget",
    "policy_loss",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
]

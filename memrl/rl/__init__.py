"""memrl.rl: the maths of RL training and the pieces a recipe composes.

- `advantages`, `losses`: pure functions over tensors (verl's formulas, with tests).
- `batch`: `RolloutBatch`, the typed batch of one step; `collate`, `pack_token_budget`.
- `actor`: `Actor` (log-probs + PPO update, its `UpdateStats`) and `Reference`.
- `logprobs`: the per-token forward (`response_logprobs`; with a value head, `response_pass`).
- `gae`, `critic`, `values`: PPO's GAE and value loss, the separate value model (`Critic`),
  and what it shares with a value head on the policy (`PolicyValueHead`, `CriticStats`).
- `optim`: AdamW, verl's lr schedules, `optimizer_step` (clip, skip non-finite, step).
- `packing`: padding-free micro-batches (`packed_inputs`, rl.remove_padding).
- `flops`: training FLOPs, MFU and padding waste (`train_flops`, `mfu`, `padding_waste`).
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
from memrl.rl.batch import OVERLONG_MODES, Conversation, RolloutBatch, collate, pack_token_budget
from memrl.rl.flops import ModelShape, mfu, padding_waste, train_flops
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
from memrl.rl.packing import packed_inputs

__all__ = [
    "ESTIMATORS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "OVERLONG_MODES",
    "SIZE1_MODES",
    "Conversation",
    "GroupStats",
    "LossNorm",
    "ModelShape",
    "RolloutBatch",
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
    "mfu",
    "pack_token_budget",
    "packed_inputs",
    "padding_waste",
    "policy_loss",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "train_flops",
]


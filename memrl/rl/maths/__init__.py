"""memrl.rl.maths: the algorithm's maths, pure functions over tensors with hand-computed tests.

- `advantages`: GRPO, RLOO, REINFORCE++ baseline, group statistics, dynamic sampling's keep.
- `gae`: PPO's GAE over a trajectory's chained conversations, the value loss, weighted moments.
- `losses`: the policy loss (PPO clip, dual clip, truncated IS), KL estimators, entropy, the
  loss aggregations and their divisors.
- `batch`: `RolloutBatch`, the typed, frozen batch of one step; `collate`, `pack_token_budget`.
- `correction`: training-inference mismatch and its truncated IS weights; `LogprobGuard`.
- `flops`: training FLOPs, MFU and padding waste.

It imports neither torch.distributed nor `memrl.distributed` (a reduction over ranks is a
function it is given), nor the trainer (`memrl.rl.trainer`), nor any model: only
`memrl.errors`, `memrl.trajectory` and itself (tests/test_layering.py).
"""

from memrl.rl.maths.advantages import (
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
from memrl.rl.maths.batch import (
    OVERLONG_MODES,
    Conversation,
    RolloutBatch,
    collate,
    pack_token_budget,
)
from memrl.rl.maths.flops import ModelShape, mfu, padding_waste, train_flops
from memrl.rl.maths.losses import (
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
    "padding_waste",
    "policy_loss",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "train_flops",
]


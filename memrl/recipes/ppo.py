"""PPO with a value model for memory agents (rl.adv_estimator gae): the step, top to bottom.

    for each step (`train_step`):
        groups, batch = rollout_batch(run, phases)   as GRPO's: sync, rollout, batch
        batch  = with_logprobs_and_values(run, batch, old)   old and reference log-probs, and
                                                             the critic's V(s_t) of every
                                                             response token
        batch  = with_gae(batch, rl, dist)           per-token advantages and returns: GAE
                                                     over each trajectory's conversations
                                                     chained in turn order (rl.gamma, rl.lam)
        stats  = actor.update(batch, dist, guard)    PPO over mini/micro-batches (a value
                                                     head on the policy: its value loss is
                                                     a term of the actor's loss)
        critic = run.critic.update(batch, dist)      the separate value model's update
        return step_record(...)

The critic is `critic.value_model`: `separate` (its own model, `Run.critic`) or
`policy_head` (a value head on the policy's body, `actor.value_head`, trained in the
actor's update). Everything else (setup, the loop, validation, checkpoints) is the GRPO
recipe's (`memrl.recipes.grpo`), which runs this step for `rl.adv_estimator: gae`.
"""

from __future__ import annotations

import torch

from memrl.distributed import Dist
from memrl.recipes.grpo import (
    OldLogprobs,
    Run,
    rollout_batch,
    step_record,
    with_logprobs,
    with_rewards_less_kl,
)
from memrl.recipes.step_metrics import Phases
from memrl.rl.config import RLConfig
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.maths.gae import gae_batch

__all__ = ["train_step", "with_gae", "with_logprobs_and_values"]


def train_step(run: Run) -> dict[str, float]:
    """One step of PPO with a value model; returns its metrics."""
    rl = run.config.rl
    phases = Phases(run.state.step + 1)  # heartbeat (what this rank is doing) and timings

    groups, batch = rollout_batch(run, phases)  # 1-3. as GRPO's: sync, rollout, one batch
    old = OldLogprobs.plan(run, batch)  # the engine's, a separate pass's or the update's

    with phases("logprobs"):  # 4. Old and reference log-probs, the critic's values (no grad).
        batch, entropy, mismatch = with_logprobs_and_values(run, batch, old)

    # 5. Rewards (minus a KL penalty, optionally) → per-token advantages and returns (GAE).
    task_rewards = batch.rewards
    batch = with_gae(batch, rl, run.dist)

    # 6. The actor's update (a value head on the policy: L = L_pg + c_vf · L_vf), then the
    # separate critic's: epochs × mini-batches × micro-batches, exact loss weights.
    lr = run.actor.lr
    with phases("update"):
        update = run.actor.update(batch, run.dist, first_on_policy=old.first is not None,
                                  guard=old.update_guard)
        critic = run.critic.update(batch, run.dist) if run.critic is not None else update.critic
    batch, entropy, mismatch = old.taken_by(update, batch, entropy, mismatch)

    with phases("metrics"):  # 7. Metrics (over every rank's share of the step).
        return step_record(run, phases, groups, batch, task_rewards, entropy, mismatch,
                           update=update, lr=lr, critic=critic)


def with_logprobs_and_values(run: Run, batch: RolloutBatch, old: OldLogprobs
                             ) -> tuple[RolloutBatch, list[torch.Tensor] | None,
                                        dict[str, float]]:
    """`grpo.with_logprobs`, and the critic's V(s_t) at every response token: the separate
    critic's pass; a value head on the policy reads them in the old log-prob pass's own
    forward, else (no separate pass, or the first mini-batch the update's forward covers)
    in a pass of their own."""
    if run.critic is not None:
        batch = batch.with_values(run.critic.values(batch))
        return with_logprobs(run, batch, old)
    if old.source not in ("pass", "pass_and_update"):  # no old pass to read them in
        return with_logprobs(run, batch.with_values(run.actor.values(batch)), old)
    read: list[list[torch.Tensor]] = []

    def old_pass(b: RolloutBatch, indices: list[int]
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        logprobs, entropy, values = run.actor.logprobs_entropy_and_values(b, indices)
        read.append(values)
        return logprobs, entropy

    batch, entropy, mismatch = with_logprobs(run, batch, old, old_pass)
    values = read[0]
    if old.first is not None:  # and the first mini-batch's from a pass of their own
        skip = set(old.first)
        own = run.actor.values(batch, sorted(skip))
        values = [own[i] if i in skip else v for i, v in enumerate(values)]
    return batch.with_values(values), entropy, mismatch


def with_gae(batch: RolloutBatch, rl: RLConfig, dist: Dist = Dist()) -> RolloutBatch:
    """The batch's rewards less the KL penalty (rl.use_kl_in_reward), and per-token
    advantages and returns from them and the critic's values (`gae_batch`, whitened over
    every rank's share of the step: `dist`)."""
    batch = with_rewards_less_kl(batch, rl)
    return gae_batch(batch, gamma=rl.gamma, lam=rl.lam, all_reduce_sum=dist.all_reduce_sum)

"""The RL algorithm's and the optimizer's settings, typed and validated.

These are the sections `memrl.rl` reads (`RLConfig` → advantages, losses, the actor's
update; `OptimConfig` → optimizer and lr schedule). The whole training config, with model,
data, agent and trainer sections, is `memrl.recipes.config.TrainConfig`. docs/training.md
gives the verl key that each field corresponds to.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from memrl.config import StrictModel


class RLConfig(StrictModel):
    # (how rollouts sample, `rollout.n` included, is the training config's `rollout`)
    # ---- rewards and advantages
    reward: str | dict[str, float] | None = None
    """The task's reward: one of its named rewards (memagent: sub_em, em, f1, memagent_em,
    context_overlap; memupdate: memory_delta), or a weighted sum `{name: weight, ...}`, each
    part logged as `train/reward/<name>` (memrl.tasks.rewards). None: the task's first
    (sub_em / memory_delta)."""
    adv_estimator: Literal["grpo", "rloo", "reinforce_plus_plus_baseline", "gae"] = "grpo"
    """verl algorithm.adv_estimator. `gae`: PPO with a learned value model (the `critic`
    section), per-token advantages by GAE(gamma, lam) over each trajectory's conversations
    chained in turn order (memrl.rl.maths.gae; docs/algorithms.md)."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount of GAE per response token (verl algorithm.gamma); gae only."""
    lam: float = Field(1.0, ge=0, le=1)
    """λ of GAE (verl algorithm.lam): 1 = Monte-Carlo return minus the value, 0 = one-step
    TD; gae only."""
    norm_adv_by_std: bool = False
    """False = mean-centred only (Dr.GRPO, MemAgent); True = classic GRPO."""
    size1_group_advantage: Literal["zero", "raw_reward"] = "zero"
    """Advantage of a group of one trajectory: zero (it has no baseline), or verl's raw
    reward. rollout.n=1 requires raw_reward (or adv_estimator gae, which needs no group)."""
    dynamic_sampling: bool = True
    """DAPO: drop groups whose rewards are all equal, refill from the next questions."""
    max_refill_rounds: int = Field(2, ge=0)
    """Extra rollout rounds a step may take to refill dropped groups."""
    use_kl_in_reward: bool = False
    """Subtract kl_reward_coef · KL(π_old ‖ π_ref), summed over a trajectory's tokens, from
    its reward (verl algorithm.use_kl_in_reward)."""
    kl_reward_coef: float = Field(0.0, ge=0)
    """verl algorithm.kl_ctrl.kl_coef."""
    kl_penalty: Literal["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"] = "k1"
    """KL estimator of the reward penalty (verl algorithm.kl_penalty)."""
    # ---- policy loss
    clip_ratio_low: float = Field(0.2, ge=0)
    """PPO clip range below 1 of the probability ratio (verl actor.clip_ratio_low)."""
    clip_ratio_high: float = Field(0.2, ge=0)
    """PPO clip range above 1 (verl actor.clip_ratio_high; DAPO's clip-higher when above clip_ratio_low)."""
    clip_ratio_c: float | None = Field(3.0, gt=1)
    """Dual-clip bound for negative advantages (verl clip_ratio_c, default 3.0); None
    disables it."""
    loss_agg_mode: Literal[
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
        "traj-mean-token-mean",
    ] = "token-mean"
    """How token losses become one number (verl actor.loss_agg_mode; traj-mean-token-mean
    weighs every trajectory the same however many conversations it has)."""
    loss_scale_factor: float | None = Field(None, gt=0)
    """The constant divisor of seq-mean-token-sum-norm (Dr.GRPO; verl loss_scale_factor),
    e.g. the longest response allowed."""
    entropy_coeff: float = 0.0
    """Entropy bonus (verl actor.entropy_coeff)."""
    use_kl_loss: bool = True
    """Add the KL to the reference model to the loss (verl actor.use_kl_loss), as kl_loss_coef x kl_loss_type."""
    kl_loss_coef: float = Field(0.001, ge=0)
    """Weight of the KL loss (verl actor.kl_loss_coef)."""
    kl_loss_type: Literal["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"] = "low_var_kl"
    """KL estimator of the KL loss (verl actor.kl_loss_type)."""
    overlong: Literal["mask", "keep"] = "mask"
    """Responses cut at max tokens: "mask" gives them zero loss weight, "keep" trains them."""
    # ---- training–inference mismatch (verl algorithm.rollout_correction;
    # memrl.rl.maths.correction)
    use_rollout_logprobs: bool = False
    """Use the rollout engine's log-probs as the old log-probs and skip the recompute pass
    (verl rollout_correction.bypass_mode): the PPO ratio is then π_θ / π_rollout."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Truncated importance sampling: weigh each token's policy-gradient loss by
    min(π_old / π_rollout, rollout_is_threshold), per token or per conversation (verl
    rollout_correction.rollout_is). None: off."""
    rollout_is_threshold: float = Field(2.0, gt=0)
    """The cap C of the IS weights (verl rollout_correction.rollout_is_threshold)."""
    old_logprobs: Literal["auto", "recompute"] = "auto"
    """Where the old log-probs (π_old of the PPO ratio) come from when they are the
    trainer's. `auto`: when the step is on-policy (ppo_epochs 1 and the batch is one
    mini-batch, so one optimizer step) the update takes them from its own forward, detached
    (ratio 1; the loss and gradients are those of the separate pass, which it skips: verl's
    dp_actor does the same). With ppo_epochs 1 and several mini-batches the first
    mini-batch is still on-policy (no weight has changed before its optimizer step): the
    update takes its old log-probs from its forward, and the separate no-grad pass covers
    the other mini-batches only. Otherwise the separate pass covers the batch. `recompute`:
    always the separate pass over the whole batch. rl.use_rollout_logprobs (the engine's)
    and a KL penalty in the reward (it needs them before the update) take precedence over
    `auto`."""
    # ---- optimisation schedule
    ppo_epochs: int = Field(1, ge=1)
    """Passes of the update over each step's batch (verl actor.ppo_epochs)."""
    ppo_mini_batch_size: int = Field(2, ge=1)
    """Questions per optimizer step; each brings all conversations of its rollout.n
    trajectories."""
    use_dynamic_bsz: bool = True
    """Micro-batches by token budget (verl use_dynamic_bsz) instead of a fixed size."""
    max_tokens_per_micro_batch: int = Field(16384, ge=1)
    """Token budget of one forward/backward (verl ppo_max_token_len_per_gpu)."""
    micro_batch_size: int = Field(4, ge=1)
    """Samples per micro-batch when use_dynamic_bsz is False."""
    remove_padding: bool | Literal["auto"] = "auto"
    """Run each micro-batch as one packed row of its samples' real tokens (position_ids
    restart at 0 per sample, no attention mask: `memrl.rl.trainer.packing`) and count only real
    tokens against max_tokens_per_micro_batch (verl model.use_remove_padding). False: rows
    right-padded to the longest, the budget counting rows × longest row. `auto`
    (default): packed when the model attends with model.attn_implementation varlen (its
    default on a GPU), padded otherwise (packed sdpa would build a dense mask of the whole
    row; packed flex_attention measured slower than padded sdpa)."""

    @field_validator(
        "kl_reward_coef", "clip_ratio_low", "clip_ratio_high",
        "clip_ratio_c", "entropy_coeff", "kl_loss_coef", "loss_scale_factor",
        "rollout_is_threshold",
    )
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        if self.rollout_is is not None and self.use_rollout_logprobs:
            raise ValueError(
                "rollout_is weighs by π_old / π_rollout, which is 1 when the old log-probs are "
                "the engine's (use_rollout_logprobs): use one or the other"
            )
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.loss_scale_factor is None:
            raise ValueError("loss_agg_mode seq-mean-token-sum-norm needs loss_scale_factor")
        return self

    def old_logprob_source(self, num_mini_batches: int
                           ) -> Literal["engine", "pass", "update", "pass_and_update"]:
        """Where a step's old log-probs come from, given its number of mini-batches: the
        rollout engine (use_rollout_logprobs), a separate no-grad pass before the update,
        the update's own forward (on-policy with old_logprobs auto), or both: the update's
        forward for the first mini-batch, the pass for the others (ppo_epochs 1, several
        mini-batches, old_logprobs auto)."""
        if self.use_rollout_logprobs:
            return "engine"
        kl_in_reward = self.use_kl_in_reward and self.kl_reward_coef > 0
        if self.old_logprobs == "recompute" or kl_in_reward or self.ppo_epochs != 1:
            return "pass"
        return "update" if num_mini_batches == 1 else "pass_and_update"

    @property
    def needs_reference(self) -> bool:
        return (self.use_kl_loss and self.kl_loss_coef > 0) or (
            self.use_kl_in_reward and self.kl_reward_coef > 0
        )


class OptimConfig(StrictModel):
    """The actor's optimizer (`optim`), and the critic's (`critic.optim`)."""

    lr: float = Field(1e-6, gt=0)
    """AdamW learning rate (verl actor.optim.lr)."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW weight decay (verl optim.weight_decay)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup steps, verl's schedule (lr_warmup_steps): step s of the first W uses
    lr · s / W (so the very first uses 0), then lr."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global gradient norm (verl actor.grad_clip)."""
    lr_scheduler: Literal["constant", "cosine"] = "constant"
    """After the warmup: keep lr ("constant"), or decay it along a half cosine to
    lr · min_lr_ratio at the run's last step ("cosine"), as verl's lr_scheduler_type
    (formerly warmup_style)."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """The cosine schedule's floor and warmup start, as a fraction of lr (verl
    min_lr_ratio); ignored by "constant"."""

    @field_validator("lr", "weight_decay", "grad_clip")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        return value

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError(f"each beta must be in [0, 1), got {list(value)}")
        return value


class CriticConfig(StrictModel):
    """The value model of `rl.adv_estimator: gae` (verl critic.*): a separate model, a causal
    LM's transformer body with a linear head giving one value per token (verl's
    AutoModelForTokenClassification critic), or a linear head on the policy
    (`value_model`). Ignored by the other estimators."""

    value_model: Literal["separate", "policy_head"] = "separate"
    """`separate`: a model of its own (init, optim, micro-batching below; verl's critic).
    `policy_head`: a linear value head on the policy's last hidden state, sharing its body
    (OpenAI baselines' shared-body PPO, TRL's AutoModelForCausalLMWithValueHead), trained
    in the actor's update by one backward of pg_loss + vf_coef · vf_loss, in the actor's
    micro-batches (padded or rl.remove_padding); its parameters are a parameter group of
    the actor's AdamW with critic.optim's lr and weight_decay (the actor's betas, lr
    schedule and gradient clip, over the policy and the head together). Its values come
    from the old log-prob pass, or from a pass of their own when a step has none. Not with
    model.strategy fsdp; critic.init and the critic's micro-batch sizes are the separate
    model's."""
    vf_coef: float = Field(0.1, gt=0)
    """Weight of the value loss in the joint loss of value_model policy_head (TRL
    PPOConfig's default, as OpenAI's lm-human-preferences; baselines' ppo2 uses 0.5).
    Unused by a separate critic, whose loss is its own."""
    init: str = "policy"
    """Where its body's weights come from: `policy` (model.path, the policy's initial
    weights; verl critic.model.path = the actor's) or the directory of a Hugging Face
    causal LM with the policy's vocabulary. The head starts near 0 (normal weights of std
    1/(hidden_size + 1), bias 0: OpenRLHF's init)."""
    optim: OptimConfig = OptimConfig(lr=1e-5)
    """Its own AdamW and lr schedule (verl critic.optim; lr 1e-5 and critic.grad_clip as
    verl's defaults), stepped with the actor's. value_model policy_head: the lr and
    weight_decay of the head's parameter group in the actor's AdamW (the rest unused)."""
    cliprange_value: float = Field(0.5, gt=0)
    """Clip of the new values around the rollout's (verl critic.cliprange_value)."""
    max_tokens_per_micro_batch: int | None = Field(None, ge=1)
    """Token budget of one critic forward/backward with rl.use_dynamic_bsz (verl
    critic.ppo_max_token_len_per_gpu); None: rl.max_tokens_per_micro_batch."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Samples per critic micro-batch without rl.use_dynamic_bsz (verl
    critic.ppo_micro_batch_size_per_gpu); None: rl.micro_batch_size."""

    @field_validator("cliprange_value", "vf_coef")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        return value

"""The training config: every knob of `memrl train`, typed and validated.

Sections map one-to-one to the objects they configure. docs/configuration.md gives the verl
key that each one corresponds to.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from memrl.agents.memagent import MemAgentConfig
from memrl.agents.memupdate import MemUpdateConfig
from memrl.config import StrictModel


class LoraConfig(StrictModel):
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = "all-linear"


class ModelConfig(StrictModel):
    path: str = Field(..., description="HF model directory or hub id of the policy")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: bfloat16 on CUDA, float32 on CPU."""
    device: str | None = None
    gradient_checkpointing: bool = False
    lora: LoraConfig = LoraConfig()


class DataConfig(StrictModel):
    train_file: str
    val_file: str | None = None
    format: Literal["auto", "official", "ircot", "memrl", "parquet", "ruler", "locomo"] = "auto"
    train_batch_size: int = Field(4, ge=1)
    """Questions per training step (verl data.train_batch_size)."""
    shuffle: bool = True
    val_limit: int | None = Field(None, ge=1)
    """Use only the first K validation questions."""


class RLConfig(StrictModel):
    # rollout (sampling temperature / top_p of training rollouts: memagent.temperature/top_p)
    rollout_n: int = Field(4, ge=1)
    """Trajectories per question: the GRPO group (verl actor_rollout_ref.rollout.n)."""
    val_n: int = Field(1, ge=1)
    val_temperature: float = Field(0.0, ge=0)
    generation_batch_size: int = Field(64, ge=1)
    # advantages
    adv_estimator: Literal["grpo", "rloo", "reinforce_plus_plus_baseline"] = "grpo"
    norm_adv_by_std: bool = False
    """False = mean-centred only (Dr.GRPO, MemAgent); True = classic GRPO."""
    dynamic_sampling: bool = True
    """DAPO: drop groups whose rewards are all equal, refill from the next questions."""
    max_refill_rounds: int = Field(2, ge=0)
    reward: Literal["sub_em", "em", "f1", "context_overlap"] = "sub_em"
    """Score of the final answer; context_overlap is a dense smoke-test reward for tiny
    random models (memrl.rewards.shaping), not a measure of answer quality."""
    # policy loss
    clip_ratio_low: float = Field(0.2, ge=0)
    clip_ratio_high: float = Field(0.2, ge=0)
    clip_ratio_c: float | None = Field(None, gt=1)
    """Dual-clip bound for negative advantages (verl clip_ratio_c); None disables it."""
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "traj-mean-token-mean"
    ] = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = True
    kl_loss_coef: float = Field(0.001, ge=0)
    kl_loss_type: Literal["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"] = "low_var_kl"
    use_kl_in_reward: bool = False
    kl_reward_coef: float = Field(0.0, ge=0)
    overlong: Literal["mask", "keep"] = "mask"
    """Responses cut at max tokens: "mask" gives them zero loss weight, "keep" trains them."""
    # optimisation schedule
    ppo_epochs: int = Field(1, ge=1)
    ppo_mini_batch_size: int = Field(2, ge=1)
    """Questions per optimizer step; each brings all conversations of its rollout_n trajectories."""
    use_dynamic_bsz: bool = True
    max_tokens_per_micro_batch: int = Field(16384, ge=1)
    """Token budget of one forward/backward (verl ppo_max_token_len_per_gpu)."""
    micro_batch_size: int = Field(4, ge=1)
    """Samples per micro-batch when use_dynamic_bsz is False."""

    @property
    def needs_reference(self) -> bool:
        return (self.use_kl_loss and self.kl_loss_coef > 0) or (
            self.use_kl_in_reward and self.kl_reward_coef > 0
        )


class OptimConfig(StrictModel):
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    """Linear warmup steps (verl lr_warmup_steps), then constant."""
    grad_clip: float = Field(1.0, gt=0)


class TrainerConfig(StrictModel):
    out_dir: str = "runs/train"
    total_epochs: int = Field(1, ge=1)
    total_steps: int | None = Field(None, ge=1)
    """Stop after this many steps even if epochs remain."""
    test_freq: int = Field(0, ge=0)
    """Validate every N steps (0 = never, except val_before_train and at the end)."""
    val_before_train: bool = True
    save_freq: int = Field(0, ge=0)
    """Checkpoint every N steps (0 = only at the end)."""
    keep_last: int = Field(2, ge=1)
    resume: Literal["auto", "never"] = "never"
    """auto: continue from the latest checkpoint in out_dir/checkpoints if there is one.
    never: start fresh, and refuse an out_dir that already holds checkpoints (nothing lost)."""
    log_sinks: list[Literal["jsonl", "console", "tensorboard", "wandb"]] = ["jsonl", "console"]
    wandb_project: str = "memrl"
    num_logged_trajectories: int = Field(4, ge=0)
    """Sample trajectories written to disk at each validation."""


class TrainConfig(StrictModel):
    seed: int = 0
    agent: Literal["memagent", "memupdate"] = "memagent"
    model: ModelConfig
    data: DataConfig
    memagent: MemAgentConfig = MemAgentConfig()
    memupdate: MemUpdateConfig = MemUpdateConfig()
    rl: RLConfig = RLConfig()
    optim: OptimConfig = OptimConfig()
    trainer: TrainerConfig = TrainerConfig()

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.rl.ppo_mini_batch_size > self.data.train_batch_size:
            raise ValueError(
                f"rl.ppo_mini_batch_size ({self.rl.ppo_mini_batch_size}) exceeds "
                f"data.train_batch_size ({self.data.train_batch_size})"
            )
        return self

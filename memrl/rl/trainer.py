"""The training loop: rollouts → rewards → advantages → PPO-clip updates, top to bottom.

One `Trainer.fit()` call reads as the algorithm does:

    for each step:
        questions   = the next train_batch_size questions of the shuffled data stream
        trajectories = task.rollout(questions, rollout_n)       # with the current weights
        rewards     = task reward of each trajectory            # e.g. the final answer only
        keep groups with different rewards, refill from the next questions (DAPO)
        advantages  = per trajectory, grouped by question id
        samples     = one per conversation (turn), each with its trajectory's advantage
        old / ref log-probs (no grad)
        ppo_epochs × mini-batches (ppo_mini_batch_size questions) × token-budget micro-batches:
            loss = PPO-clip + kl_loss_coef·KL(π‖π_ref) − entropy_coeff·H, exact global weights
        optimizer step (grad clip), lr schedule, metrics, validation, checkpoint

The policy used for generation is the very module being trained (no copy, no sync).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memrl.agents.trajectory import Trajectory
from memrl.config import config_to_yaml
from memrl.errors import MemrlInputError
from memrl.inference.hf import HFGenerator
from memrl.metrics import (
    MetricsLogger,
    plot_training_curves,
    scrub_env_secrets,
    truncate_metrics,
)
from memrl.rl import advantages as adv_fns
from memrl.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from memrl.rl.config import TrainConfig
from memrl.tasks import Task, build_task
from memrl.rl.losses import (
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    kl_penalty_reward,
    logprobs_from_logits,
    policy_loss,
)
from memrl.rl.samples import (
    Sample,
    collate,
    pack_token_budget,
    sample_loss_weights,
    trajectories_to_samples,
)

RewardFn = Callable[[Trajectory, Any], float]
"""Optional override of the task's reward: (trajectory, record) -> float."""


@dataclass
class TrainState:
    """Everything besides tensors that a resumed run needs to continue exactly."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0
    """Position in the current epoch's shuffled order of training questions."""


class QuestionStream:
    """Training questions, shuffled per epoch by (seed, epoch), consumed with a cursor.

    The order depends only on the seed and the epoch, so a resumed run that restores
    (epoch, cursor) sees exactly the questions an uninterrupted run would.
    """

    def __init__(self, records: Sequence[Any], seed: int, shuffle: bool, state: TrainState):
        if not records:
            raise MemrlInputError("the training set is empty", location="data.train_file")
        self.records = list(records)
        self.seed = seed
        self.shuffle = shuffle
        self.state = state

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[Any]:
        out: list[Any] = []
        order = self._order(self.state.epoch)
        while len(out) < k:
            if self.state.cursor >= len(order):
                self.state.epoch += 1
                self.state.cursor = 0
                order = self._order(self.state.epoch)
            out.append(self.records[order[self.state.cursor]])
            self.state.cursor += 1
        return out


def informative_groups(rewards: Sequence[float], trajectories: Sequence[Trajectory]) -> int:
    """Number of groups whose rewards are not all equal (the ones that carry a signal)."""
    by_group: dict[str, set[float]] = {}
    for t, r in zip(trajectories, rewards, strict=True):
        by_group.setdefault(t.record_id, set()).add(r)
    return sum(len(v) > 1 for v in by_group.values())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int, phase: int) -> int:
    """A distinct, reproducible sampling seed for each (step, phase) of a run."""
    return (seed * 1_000_003 + step * 101 + phase) % 2**31


class Trainer:
    """GRPO-family RL for memory agents. Build it from a TrainConfig and call `fit()`."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        task: Task | None = None,
        reward_fn: RewardFn | None = None,
        console: Any = None,
    ) -> None:
        self.config = config
        self.task = task if task is not None else build_task(config)
        self.reward_fn = reward_fn
        self.console = console
        self.out_dir = Path(config.trainer.out_dir)
        self.policy: Any = None
        self.reference: Any = None
        self.tokenizer: Any = None
        self.generator: HFGenerator | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.state = TrainState()

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Load data, policy (+LoRA), reference, optimizer; resume from a checkpoint."""
        cfg = self.config
        seed_everything(cfg.seed)
        self.train_records = self.task.load(cfg.data.train_file, cfg.data.format, what="training")
        self.val_records: list[Any] = []
        if cfg.data.val_file:
            self.val_records = self.task.load(cfg.data.val_file, cfg.data.format, what="validation")
            if cfg.data.val_limit:
                self.val_records = self.val_records[: cfg.data.val_limit]

        self.policy, self.tokenizer = self._load_policy()
        self.reference = self._load_reference() if cfg.rl.needs_reference else None
        self.generator = HFGenerator(
            self.policy, self.tokenizer, max_batch_size=cfg.rl.generation_batch_size
        )
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        warmup = cfg.optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
        )
        self.state = TrainState()
        latest = latest_checkpoint(self.checkpoint_root)
        if cfg.trainer.resume == "auto" and latest is not None:
            saved = load_checkpoint(
                latest, model=self.policy, optimizer=self.optimizer, scheduler=self.scheduler
            )
            self.state = TrainState(**{k: saved[k] for k in ("step", "epoch", "cursor")})
            truncate_metrics(self.out_dir / "metrics.jsonl", self.state.step)
            self._say(f"resumed from {latest} at step {self.state.step}")
        elif latest is not None:
            raise MemrlInputError(
                f"{self.checkpoint_root} already holds checkpoints: pass --resume "
                "(trainer.resume=auto) to continue, or choose another trainer.out_dir",
                location="trainer.out_dir",
            )
        elif (self.out_dir / "metrics.jsonl").exists():
            # A fresh run in a used directory: start the metrics file anew.
            truncate_metrics(self.out_dir / "metrics.jsonl", -1)
        self.stream = QuestionStream(
            self.train_records, cfg.seed, cfg.data.shuffle, self.state
        )

    @property
    def checkpoint_root(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def _torch_dtype(self, device: torch.device) -> torch.dtype:
        name = self.config.model.dtype
        if name == "auto":
            # Master weights stay float32; CUDA forward passes run under bf16 autocast.
            return torch.float32
        return getattr(torch, name)

    def _load_policy(self) -> tuple[Any, Any]:
        mcfg = self.config.model
        device = torch.device(mcfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        gen = HFGenerator.from_pretrained(
            mcfg.path, device=device, dtype=self._torch_dtype(device)
        )
        model, tokenizer = gen.model, gen.tokenizer
        if mcfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
        if mcfg.lora.enabled:
            from memrl.errors import require

            peft = require("peft", extra="lora", feature="LoRA training")
            lora = peft.LoraConfig(
                r=mcfg.lora.r,
                lora_alpha=mcfg.lora.alpha,
                lora_dropout=mcfg.lora.dropout,
                target_modules=mcfg.lora.target_modules,
                task_type="CAUSAL_LM",
            )
            model = peft.get_peft_model(model, lora)
        model.train()
        return model, tokenizer

    def _load_reference(self) -> Any:
        """The frozen initial policy: LoRA disables its adapters, otherwise a second copy."""
        if self.config.model.lora.enabled:
            return None  # computed with `policy.disable_adapter()`
        mcfg = self.config.model
        ref = HFGenerator.from_pretrained(
            mcfg.path, device=self.device, dtype=self._torch_dtype(self.device)
        ).model
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.device.type == "cuda" and self.config.model.dtype == "auto":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    # ------------------------------------------------------------------ loop
    def fit(self) -> TrainState:
        """Run training to `total_steps`; validates and checkpoints on the configured cadence."""
        if self.policy is None:
            self.setup()
        cfg, tcfg = self.config, self.config.trainer
        total = self.total_steps()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.yaml").write_text(
            scrub_env_secrets(config_to_yaml(cfg)), encoding="utf-8"
        )
        with MetricsLogger(
            self.out_dir,
            tcfg.log_sinks,
            run_config=cfg.model_dump(mode="json"),
            wandb_project=tcfg.wandb_project,
        ) as logger:
            if self.state.step == 0 and tcfg.val_before_train and self.val_records:
                logger.log(0, self.validate())
            while self.state.step < total:
                metrics = self.train_step()
                self.state.step += 1
                step = self.state.step
                if self.val_records and (
                    (tcfg.test_freq and step % tcfg.test_freq == 0) or step == total
                ):
                    metrics.update(self.validate())
                logger.log(step, metrics)
                if (tcfg.save_freq and step % tcfg.save_freq == 0) or step == total:
                    self.save()
        plot_training_curves(self.out_dir / "metrics.jsonl", self.out_dir / "training.png")
        return self.state

    def total_steps(self) -> int:
        cfg = self.config
        if cfg.trainer.total_steps is not None:
            return cfg.trainer.total_steps
        per_epoch = max(1, len(self.train_records) // cfg.data.train_batch_size)
        return per_epoch * cfg.trainer.total_epochs

    def save(self) -> Path:
        return save_checkpoint(
            self.checkpoint_root,
            self.state.step,
            model=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            tokenizer=self.tokenizer,
            trainer_state=asdict(self.state),
            config_yaml=config_to_yaml(self.config),
            keep_last=self.config.trainer.keep_last,
        )

    # ------------------------------------------------------------------ one step
    def train_step(self) -> dict[str, float]:
        rl = self.config.rl
        t0 = time.perf_counter()

        # 1. Rollouts (+ DAPO dynamic sampling with refill from the next questions).
        records, trajectories, rewards, groups_seen = self._collect_groups()
        t_rollout = time.perf_counter() - t0

        # 2. One sample per conversation; old (and reference) log-probs with no grad.
        samples = trajectories_to_samples(
            trajectories, torch.zeros(len(trajectories)), overlong=rl.overlong
        )
        old = self._sequence_logprobs(self.policy, samples)
        for s, lp in zip(samples, old, strict=True):
            s.old_logprobs = lp
        ref = self._reference_logprobs(samples) if rl.needs_reference else None

        # 3. Rewards (optionally minus a KL penalty) → advantages, shared by every turn.
        reward_t = torch.tensor(rewards, dtype=torch.float32)
        kl_penalty_mean = 0.0
        if rl.use_kl_in_reward and ref is not None:
            penalised = self._kl_reward(reward_t, samples, ref)
            kl_penalty_mean = float((reward_t - penalised).mean())
            reward_t = penalised
        advantages = self._advantages(reward_t, [t.record_id for t in trajectories])
        for s in samples:
            s.advantage = float(advantages[s.traj_id])

        # 4. PPO epochs × mini-batches (by question) × token-budget micro-batches.
        t1 = time.perf_counter()
        update = self._update(samples, ref)
        t_update = time.perf_counter() - t1
        self.scheduler.step()

        # 5. Metrics.
        train_tokens = sum(s.num_tokens for s in samples)
        response_tokens = sum(len(s.response_ids) for s in samples)
        lens_by_kind: dict[str, list[int]] = {}
        for s in samples:
            lens_by_kind.setdefault(s.turn_kind, []).append(len(s.response_ids))
        metrics = {
            "train/reward_mean": float(np.mean(rewards)),
            "train/reward_std": float(np.std(rewards)),
            **{f"train/{k}": v for k, v in self.task.summarize(trajectories).items()},
            "train/groups": float(len(set(t.record_id for t in trajectories))),
            "train/informative_groups": float(informative_groups(rewards, trajectories)),
            "train/groups_generated": float(groups_seen),
            "train/samples": float(len(samples)),
            **{f"train/{k}_response_len": float(np.mean(v)) for k, v in lens_by_kind.items()},
            "train/truncated_frac": float(np.mean([s.truncated for s in samples])),
            "train/advantage_abs_mean": float(advantages.abs().mean()),
            "train/kl_reward_penalty": kl_penalty_mean,
            "train/lr": float(self.optimizer.param_groups[0]["lr"]),
            **update,
            "perf/rollout_tokens_per_s": response_tokens / max(t_rollout, 1e-9),
            "perf/train_tokens_per_s": train_tokens * rl.ppo_epochs / max(t_update, 1e-9),
            "perf/step_time_s": time.perf_counter() - t0,
        }
        return metrics

    def _rollout(self, records: Sequence[Any], n: int, seed: int, temperature=None):
        """Trajectories (with rewards) for `records`, sampled with the current weights."""
        with self._autocast():
            trajectories = self.task.rollout(
                self.generator, records, num_samples=n, seed=seed, temperature=temperature
            )
        if self.reward_fn is not None:
            by_id = {r.id: r for r in records}
            for t in trajectories:
                t.reward = float(self.reward_fn(t, by_id[t.record_id]))
        return trajectories

    def _collect_groups(self):
        """Rollouts for the next questions; with dynamic sampling, keep only informative
        groups (rewards not all equal) and refill from later questions, up to
        `max_refill_rounds` extra rounds, until train_batch_size groups are kept."""
        cfg, rl = self.config, self.config.rl
        want = cfg.data.train_batch_size
        kept_records: list[Any] = []
        kept_trajs: list[Trajectory] = []
        kept_rewards: list[float] = []
        groups_seen = 0
        rounds = 1 + (rl.max_refill_rounds if rl.dynamic_sampling else 0)
        records: list[Any] = []
        trajs: list[Trajectory] = []
        rewards: list[float] = []
        for r in range(rounds):
            need = want - len(kept_records)
            if need <= 0:
                break
            records = self.stream.take(need)
            groups_seen += len(records)
            trajs = self._rollout(
                records, rl.rollout_n, step_seed(cfg.seed, self.state.step, r)
            )
            by_id = {rec.id: rec for rec in records}
            rewards = [float(t.reward) for t in trajs]
            if rl.dynamic_sampling:
                keep = adv_fns.dynamic_sampling_keep(
                    torch.tensor(rewards), [t.record_id for t in trajs]
                ).tolist()
            else:
                keep = [True] * len(trajs)
            # A question already kept (the stream wrapped into a new epoch during refill)
            # is not kept twice: its two groups would merge into one.
            taken = {rec.id for rec in kept_records}
            keep = [k and t.record_id not in taken for t, k in zip(trajs, keep, strict=True)]
            kept_ids = {t.record_id for t, k in zip(trajs, keep, strict=True) if k}
            kept_records.extend(rec for rec in by_id.values() if rec.id in kept_ids)
            for t, rew, k in zip(trajs, rewards, keep, strict=True):
                if k:
                    kept_trajs.append(t)
                    kept_rewards.append(rew)
        if not kept_trajs:
            # Every group was uninformative: train on the last round anyway; all advantages
            # are zero, so the update only moves the KL and entropy terms.
            kept_records, kept_trajs, kept_rewards = list(records), trajs, rewards
        return kept_records, kept_trajs, kept_rewards, groups_seen

    def _advantages(self, rewards: torch.Tensor, group_ids: list[str]) -> torch.Tensor:
        rl = self.config.rl
        if rl.adv_estimator == "grpo":
            return adv_fns.grpo_advantages(rewards, group_ids, norm_by_std=rl.norm_adv_by_std)
        if rl.adv_estimator == "rloo":
            return adv_fns.rloo_advantages(rewards, group_ids)
        return adv_fns.reinforce_pp_baseline_advantages(rewards, group_ids)

    def _kl_reward(self, rewards, samples, ref):
        """Reward penalty β·KL(π_old‖π_ref) summed over all turns of each trajectory."""
        rl = self.config.rl
        lp, rlp, mask, traj = [], [], [], []
        for s, r in zip(samples, ref, strict=True):
            lp.append(torch.tensor(s.old_logprobs))
            rlp.append(torch.tensor(r))
            mask.append(torch.ones(len(r), dtype=torch.bool))
            traj.append(s.traj_id)
        pad = torch.nn.utils.rnn.pad_sequence
        return kl_penalty_reward(
            rewards,
            pad(lp, batch_first=True),
            pad(rlp, batch_first=True),
            pad(mask, batch_first=True),
            torch.tensor(traj),
            coef=rl.kl_reward_coef,
            kind=rl.kl_loss_type,
        )

    # ------------------------------------------------------------------ log-probs
    def _micro_batches(self, samples: Sequence[Sample]) -> list[list[int]]:
        rl = self.config.rl
        if rl.use_dynamic_bsz:
            return pack_token_budget(samples, rl.max_tokens_per_micro_batch, padded=True)
        n, k = len(samples), rl.micro_batch_size
        return [list(range(i, min(i + k, n))) for i in range(0, n, k)]

    def _temperature(self) -> float:
        t = self.task.sampling_temperature
        return t if t > 0 else 1.0

    def _forward(self, model, batch, *, with_entropy: bool):
        """Per-token log-probs (and entropy) aligned with batch["labels"] (logit position t)."""
        dev = self.device
        with self._autocast():
            out = model(
                input_ids=batch["input_ids"].to(dev),
                attention_mask=batch["attention_mask"].to(dev),
                position_ids=batch["position_ids"].to(dev),
                use_cache=False,
            )
        logits = out.logits.float() / self._temperature()
        logprobs = logprobs_from_logits(logits, batch["labels"].to(dev))
        entropy = None
        if with_entropy:
            # Without an entropy bonus it is only a metric: no graph, less peak memory.
            grad = torch.is_grad_enabled() and self.config.rl.entropy_coeff != 0
            with torch.set_grad_enabled(grad):
                entropy = entropy_from_logits(logits)
        return logprobs, entropy

    @torch.no_grad()
    def _sequence_logprobs(self, model, samples: Sequence[Sample]) -> list[list[float]]:
        """Log-probs of every sample's response tokens under `model` (no grad, eval mode)."""
        was_training = model.training
        model.eval()
        out: list[list[float] | None] = [None] * len(samples)
        try:
            for idx in self._micro_batches(samples):
                batch = collate([samples[i] for i in idx], self.tokenizer.pad_token_id)
                logprobs, _ = self._forward(model, batch, with_entropy=False)
                mask = batch["response_mask"]
                for row, i in enumerate(idx):
                    out[i] = logprobs[row][mask[row].to(logprobs.device)].cpu().tolist()
        finally:
            model.train(was_training)
        return [x for x in out if x is not None]

    def _reference_logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        if self.reference is not None:
            return self._sequence_logprobs(self.reference, samples)
        with self.policy.disable_adapter():
            return self._sequence_logprobs(self.policy, samples)

    # ------------------------------------------------------------------ update
    def _update(self, samples: list[Sample], ref: list[list[float]] | None) -> dict[str, float]:
        """PPO epochs over mini-batches of questions; one optimizer step per mini-batch."""
        cfg, rl = self.config, self.config.rl
        group_order: list[str] = []
        for s in samples:
            if s.group_id not in group_order:
                group_order.append(s.group_id)
        mini_groups = [
            set(group_order[i : i + rl.ppo_mini_batch_size])
            for i in range(0, len(group_order), rl.ppo_mini_batch_size)
        ]
        use_kl = rl.use_kl_loss and rl.kl_loss_coef > 0 and ref is not None
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}

        def add(name: str, value: float) -> None:
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1

        self.policy.train()
        for _ in range(rl.ppo_epochs):
            for groups in mini_groups:
                mb_index = [i for i, s in enumerate(samples) if s.group_id in groups]
                mb = [samples[i] for i in mb_index]
                weights = sample_loss_weights(mb, rl.loss_agg_mode)
                self.optimizer.zero_grad(set_to_none=True)
                # Micro-batch losses are shares of the mini-batch loss (row_weights), so they
                # are summed over the mini-batch before being averaged over mini-batches.
                shares: dict[str, float] = {}
                for idx in self._micro_batches(mb):
                    micro = [mb[i] for i in idx]
                    batch = collate(micro, self.tokenizer.pad_token_id)
                    row_w = weights[idx].to(self.device)
                    logprobs, entropy = self._forward(
                        self.policy, batch, with_entropy=True
                    )
                    dev = logprobs.device
                    mask = batch["loss_mask"].to(dev)
                    pg, pg_metrics = policy_loss(
                        logprobs,
                        batch["old_logprobs"].to(dev),
                        batch["advantages"].to(dev),
                        mask,
                        clip_ratio_low=rl.clip_ratio_low,
                        clip_ratio_high=rl.clip_ratio_high,
                        clip_ratio_c=rl.clip_ratio_c,
                        loss_agg_mode=rl.loss_agg_mode,
                        row_weights=row_w,
                    )
                    loss = pg
                    ent = agg_loss(entropy, mask, rl.loss_agg_mode, row_weights=row_w)
                    if rl.entropy_coeff:
                        loss = loss - rl.entropy_coeff * ent
                    if use_kl:
                        # ref is aligned with `samples`; mb_index maps back to it.
                        ref_mat = torch.zeros_like(logprobs)
                        resp = batch["response_mask"]
                        for row in range(len(micro)):
                            ref_mat[row][resp[row].to(dev)] = torch.tensor(
                                ref[mb_index[idx[row]]], device=dev, dtype=ref_mat.dtype
                            )
                        kl_mat = kl_penalty(logprobs, ref_mat, rl.kl_loss_type)
                        kl = agg_loss(kl_mat, mask, rl.loss_agg_mode, row_weights=row_w)
                        loss = loss + rl.kl_loss_coef * kl
                        shares["actor/kl_loss"] = shares.get("actor/kl_loss", 0.0) + float(kl)
                    loss.backward()
                    for name, value in (("actor/pg_loss", pg), ("actor/entropy", ent)):
                        shares[name] = shares.get(name, 0.0) + float(value.detach())
                    for k, v in pg_metrics.items():
                        add(f"actor/{k}", float(v))
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.policy.parameters() if p.requires_grad],
                    cfg.optim.grad_clip,
                )
                for name, value in shares.items():
                    add(name, value)
                add("actor/grad_norm", float(grad_norm))
                if math.isfinite(float(grad_norm)):
                    self.optimizer.step()
                else:
                    add("actor/skipped_nonfinite_steps", 1.0)
                self.optimizer.zero_grad(set_to_none=True)
        return {k: sums[k] / counts[k] for k in sums}

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Score the validation questions with the current policy; log sample trajectories."""
        cfg, rl = self.config, self.config.rl
        trajs = self._rollout(
            self.val_records,
            rl.val_n,
            step_seed(cfg.seed, self.state.step, 1000),
            temperature=rl.val_temperature,
        )
        by_id = {r.id: r for r in self.val_records}
        k = cfg.trainer.num_logged_trajectories
        if k:
            from memrl.eval.report import write_jsonl

            rows = [self.task.log_row(t, by_id[t.record_id]) for t in trajs[:k]]
            write_jsonl(self.out_dir / "val_samples" / f"step_{self.state.step:06d}.jsonl", rows)
        metrics = {
            "val/score": float(np.mean([t.reward for t in trajs])),
            **{f"val/{key}": v for key, v in self.task.summarize(trajs).items()},
        }
        self._say(f"validation @ step {self.state.step}: score {metrics['val/score']:.3f}")
        return metrics


"""GRPO-family RL for memory agents: the training recipe, top to bottom.

    for each step:
        engine.sync_weights(policy)                  the engine samples the current policy
        groups = collect_groups(task.rollout, ...)   rollouts + rewards; dynamic sampling
        batch  = RolloutBatch.from_trajectories(...)  one typed batch, one sample per turn
        batch  = batch.with_logprobs(actor.logprobs(batch), reference.logprobs(batch))
        batch  = batch.with_advantages(compute_advantages(...))   one per trajectory
        metrics = actor.update(batch, dist)          PPO over mini/micro-batches
        if dist.is_main: log, validate, checkpoint

The task (agent + data + reward), the engine and the models come from the config
(`setup`); `memrl.rl` holds the maths and the actor. docs/architecture.md traces one step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memrl.config import config_to_yaml
from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.fileio import write_atomic
from memrl.distributed import note
from memrl.inference.base import derive_seed
from memrl.metrics import MetricsLogger, plot_training_curves, scrub_env_secrets, truncate_metrics
from memrl.recipes import models
from memrl.recipes.config import TrainConfig
from memrl.recipes.trajectory_log import TrajectoryLog, remove_steps_after
from memrl.rl.actor import Actor, Reference
from memrl.rl.advantages import compute_advantages
from memrl.rl.batch import RolloutBatch
from memrl.rl.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from memrl.rl.correction import check_logprob_mismatch, logprob_mismatch
from memrl.rl.rollout import QuestionStream, TrainState, collect_groups, informative_groups
from memrl.tasks import Task, build_task


@dataclass
class Run:
    """Everything a training run holds between steps."""

    config: TrainConfig
    task: Task
    engine: Any
    actor: Actor
    reference: Reference | None
    tokenizer: Any
    stream: QuestionStream
    state: TrainState
    val_records: list[Any] = field(default_factory=list)
    dist: Dist = Dist()
    console: Any = None
    trajectory_log: TrajectoryLog | None = None
    """Per-trajectory records of each step (`trainer.log_trajectories`); None: off."""

    @property
    def out_dir(self) -> Path:
        return Path(self.config.trainer.out_dir)

    def say(self, text: str) -> None:
        if self.console is not None and self.dist.is_main:
            self.console.print(text)


def train(
    config: TrainConfig,
    *,
    task: Task | None = None,
    dist: Dist | None = None,
    console: Any = None,
    on_start: Callable[[Run], None] | None = None,
) -> TrainState:
    """Train to `trainer.total_steps` (or epochs); validate and checkpoint on the cadence.

    `on_start(run)` is called once the run is set up (the CLI keeps it to say at which step
    an interrupted run stopped)."""
    note("setup")
    if dist is None:
        from memrl.distributed import init_process_group

        dist = init_process_group(config.trainer.dist_timeout_s, device=config.model.device,
                                  always=config.model.strategy == "fsdp",
                                  heartbeat_s=config.trainer.heartbeat_timeout_s)
    run = setup(config, task=task, dist=dist, console=console)
    if on_start is not None:
        on_start(run)
    tcfg, total = config.trainer, total_steps(config, len(run.stream.records))
    if run.dist.is_main:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run.out_dir / "config.yaml", scrub_env_secrets(config_to_yaml(config)))
    with MetricsLogger(
        run.out_dir,
        tcfg.log_sinks if run.dist.is_main else [],
        run_config=config.model_dump(mode="json"),
        wandb_project=tcfg.wandb_project,
    ) as logger:
        if run.state.step == 0 and tcfg.val_before_train and run.val_records:
            note("validation")
            logger.log(0, validate(run))
        while run.state.step < total:
            metrics = train_step(run)
            run.state.step += 1
            step = run.state.step
            if run.val_records and ((tcfg.test_freq and step % tcfg.test_freq == 0)
                                    or step == total):
                note("validation", step)
                metrics.update(validate(run))
            logger.log(step, metrics)
            if (tcfg.save_freq and step % tcfg.save_freq == 0) or step == total:
                note("checkpoint", step)
                save(run)
    if run.dist.is_main:
        plot_training_curves(run.out_dir / "metrics.jsonl", run.out_dir / "training.png")
    run.engine.close()
    return run.state


@dataclass
class StepView:
    """What the step's metrics are computed from: per trajectory (in the order one process
    would hold them) and per sample, gathered from every data-parallel rank."""

    trajectories: list[Any]
    """The step's trajectories without their turns (summaries only need scores and info)."""
    task_rewards: Any
    rewards: Any
    advantages: Any
    sample_lengths: list[tuple[str, int]]
    """(turn kind, response tokens) of every sample."""
    truncated: list[bool]
    response_tokens: float
    train_tokens: float

    @classmethod
    def of(cls, trajectories: list[Any], batch: RolloutBatch, task_rewards: Any) -> StepView:
        import dataclasses

        return cls(
            [dataclasses.replace(t, turns=[]) for t in trajectories],
            task_rewards, batch.rewards, batch.advantages,
            [(s.turn_kind, len(s.response_ids)) for s in batch.samples],
            [s.truncated for s in batch.samples],
            float(batch.response_tokens.sum()),
            float(sum(s.num_tokens for s in batch.samples)),
        )

    def gathered(self, dist: Dist, group_order: list[str]) -> StepView:
        """Every rank's view in one, trajectories in `group_order` (as on one process)."""
        if dist.world_size == 1:
            return self
        import torch

        parts = dist.all_gather(self)
        rows = [(t, p.task_rewards[i], p.rewards[i], p.advantages[i])
                for p in parts for i, t in enumerate(p.trajectories)]
        where = {g: i for i, g in enumerate(group_order)}
        rows.sort(key=lambda r: (where[r[0].record_id], r[0].sample_index))
        column = lambda k: torch.stack([r[k] for r in rows])  # noqa: E731
        return StepView(
            [r[0] for r in rows], column(1), column(2), column(3),
            [x for p in parts for x in p.sample_lengths],
            [x for p in parts for x in p.truncated],
            sum(p.response_tokens for p in parts),
            sum(p.train_tokens for p in parts),
        )


def train_step(run: Run) -> dict[str, float]:
    """One step of the algorithm; returns its metrics."""
    cfg, rl = run.config, run.config.rl
    t0 = time.perf_counter()
    step = run.state.step + 1  # what the heartbeat says this rank is doing (`note`)

    # 1. The engine samples from the current weights.
    note("weight sync", step)
    run.engine.wake()
    run.engine.sync_weights(run.actor.model, run.state.step)
    t_sync = time.perf_counter() - t0

    # 2. Rollout groups (+ DAPO dynamic sampling with refill from the next questions).
    note("rollout", step)
    groups = collect_groups(
        lambda records, seed: run.task.rollout(
            run.engine, records, num_samples=rl.rollout_n, seed=seed, mode=cfg.rollout.mode
        ),
        run.stream,
        want=cfg.data.train_batch_size,
        dynamic_sampling=rl.dynamic_sampling,
        max_refill_rounds=rl.max_refill_rounds,
        round_seed=lambda r: derive_seed(cfg.seed, "train", run.state.step, r),
        dist=run.dist,
    )
    run.engine.sleep()
    t_rollout = time.perf_counter() - t0 - t_sync

    # 3. One typed batch: a sample per conversation, a reward per trajectory.
    batch = RolloutBatch.from_trajectories(
        groups.trajectories, overlong=rl.overlong,
        group_order=groups.group_order if run.dist.world_size > 1 else None,
    )

    # 4. Old and reference log-probs (no grad); the old ones recomputed by the trainer, or
    #    taken from the engine (rl.use_rollout_logprobs). Mismatch: |engine − trainer|.
    t1 = time.perf_counter()
    note("log-probs", step)
    ref = run.reference.logprobs(batch) if run.reference is not None else None
    engine_lp = [torch.tensor(s.rollout_logprobs) for s in batch.samples]
    mismatch, entropy = {}, None
    if rl.use_rollout_logprobs:
        batch = batch.with_logprobs(engine_lp, ref)
    else:
        old, entropy = run.actor.logprobs_and_entropy(batch)
        batch = batch.with_logprobs(old, ref)
        diff = logprob_mismatch(engine_lp, batch.old_logprobs)
        worst = max(run.dist.all_gather(diff["max"]))  # every rank stops, or none
        check_logprob_mismatch(worst, cfg.rollout.max_logprob_diff, engine=cfg.rollout.engine,
                               step=run.state.step + 1)
        mismatch = {"rollout/logprob_diff_mean": diff["mean"],
                    "rollout/logprob_diff_max": worst}
    t_logprobs = time.perf_counter() - t1

    # 5. Rewards (minus a KL penalty, optionally) → one advantage per trajectory.
    task_rewards = batch.rewards
    if rl.use_kl_in_reward and rl.kl_reward_coef > 0:
        batch = batch.with_rewards(task_rewards - rl.kl_reward_coef * batch.kl(rl.kl_penalty))
    batch = batch.with_advantages(
        compute_advantages(
            rl.adv_estimator,
            batch.rewards,
            batch.group_ids,
            token_counts=batch.response_tokens,
            norm_by_std=rl.norm_adv_by_std,
            size1=rl.size1_group_advantage,
        )
    )

    # 6. PPO update: epochs × mini-batches × micro-batches, exact loss weights.
    lr = run.actor.lr
    t2 = time.perf_counter()
    note("update", step)
    update = run.actor.update(batch, run.dist)
    t_update = time.perf_counter() - t2

    # 7. Metrics (over every rank's share of the step).
    note("metrics", step)
    view = StepView.of(groups.trajectories, batch, task_rewards).gathered(
        run.dist, groups.group_order
    )
    trajs = view.trajectories
    lengths: dict[str, list[int]] = {}
    for kind, n in view.sample_lengths:
        lengths.setdefault(kind, []).append(n)
    if run.trajectory_log is not None:  # one row per trajectory, gathered on the main rank
        run.trajectory_log.write(run.state.step + 1, groups.trajectories, batch, task_rewards,
                                 groups.group_order, entropy)
    return {
        "train/reward_mean": float(view.task_rewards.mean()),
        "train/reward_std": float(view.task_rewards.std(unbiased=False)),
        **{f"train/{k}": v for k, v in run.task.summarize(trajs).items()},
        "train/groups": float(len({t.record_id for t in trajs})),
        "train/informative_groups": float(informative_groups(trajs)),
        "train/groups_generated": float(groups.generated),
        "train/samples": float(len(view.sample_lengths)),
        **{f"train/{k}_response_len": float(np.mean(v)) for k, v in lengths.items()},
        "train/truncated_frac": float(np.mean(view.truncated)),
        "train/advantage_abs_mean": float(view.advantages.abs().mean()),
        "train/kl_reward_penalty": float((view.task_rewards - view.rewards).mean()),
        "train/lr": lr,
        **mismatch,
        **update,
        "perf/rollout_tokens_per_s": view.response_tokens / max(t_rollout, 1e-9),
        "perf/train_tokens_per_s": view.train_tokens * rl.ppo_epochs / max(t_update, 1e-9),
        "perf/sync_s": t_sync,
        "perf/rollout_s": t_rollout,
        "perf/logprobs_s": t_logprobs,
        "perf/update_s": t_update,
        "perf/step_time_s": time.perf_counter() - t0,
    }


def validate(run: Run) -> dict[str, float]:
    """Score the validation questions with the current policy; log sample trajectories."""
    cfg, rl = run.config, run.config.rl
    run.engine.wake()
    run.engine.sync_weights(run.actor.model, run.state.step)
    mine = run.dist.shard(run.val_records)
    trajs = run.task.rollout(
        run.engine,
        mine,
        num_samples=rl.val_n,
        seed=derive_seed(cfg.seed, "val", run.state.step),
        temperature=rl.val_temperature,
        top_p=rl.val_top_p,
        mode=cfg.rollout.mode,
    ) if mine else []
    if run.dist.world_size > 1:  # every rank's share, in the validation set's order
        where = {r.id: i for i, r in enumerate(run.val_records)}
        trajs = sorted((t for part in run.dist.all_gather(trajs) for t in part),
                       key=lambda t: (where[t.record_id], t.sample_index))
    metrics = {
        "val/score": float(np.mean([t.reward for t in trajs])),
        **{f"val/{key}": v for key, v in run.task.summarize(trajs).items()},
    }
    k = cfg.trainer.num_logged_trajectories
    if k and run.dist.is_main:
        from memrl.eval.report import write_jsonl

        by_id = {r.id: r for r in run.val_records}
        rows = [run.task.log_row(t, by_id[t.record_id]) for t in trajs[:k]]
        write_jsonl(run.out_dir / "val_samples" / f"step_{run.state.step:06d}.jsonl", rows)
    run.say(f"validation @ step {run.state.step}: score {metrics['val/score']:.3f}")
    return metrics


def save(run: Run) -> Path | None:
    """A checkpoint of the policy, optimizer, schedule, RNG and data cursor (every rank
    takes part; the next step starts once it is complete)."""
    return save_checkpoint(
        run.out_dir / "checkpoints",
        run.state.step,
        model=run.actor.model,
        optimizer=run.actor.optimizer,
        scheduler=run.actor.scheduler,
        tokenizer=run.tokenizer,
        trainer_state=asdict(run.state),
        config_yaml=config_to_yaml(run.config),
        keep_last=run.config.trainer.keep_last,
        dist=run.dist,
    )


def total_steps(config: TrainConfig, num_records: int) -> int:
    if config.trainer.total_steps is not None:
        return config.trainer.total_steps
    per_epoch = max(1, num_records // config.data.train_batch_size)
    return per_epoch * config.trainer.total_epochs


def setup(
    config: TrainConfig, *, task: Task | None = None, dist: Dist | None = None, console: Any = None
) -> Run:
    """Data, policy (+LoRA), reference, engine, optimizer; resume from a checkpoint."""
    seed_everything(config.seed)
    dist = dist or Dist.from_environment()
    if dist.world_size > 1 and config.rl.adv_estimator == "reinforce_plus_plus_baseline":
        raise MemrlInputError(
            "reinforce_plus_plus_baseline whitens advantages over the whole batch, which "
            "data-parallel ranks do not hold: train it on one process, or use grpo / rloo",
            location="rl.adv_estimator",
        )
    task = task if task is not None else build_task(config)
    train_records = task.load(config.data.train_file, config.data.format, what="training")
    val_records: list[Any] = []
    if config.data.val_file:
        val_records = task.load(config.data.val_file, config.data.format, what="validation")
        val_records = val_records[: config.data.val_limit]

    policy, tokenizer = models.load_policy(config.model)
    temperature = task.sampling_temperature
    actor = models.build_actor(config, policy, tokenizer, temperature, dist,
                               total_steps=total_steps(config, len(train_records)))
    reference = models.build_reference(config, policy, tokenizer, temperature, dist)
    engine = models.build_engine(config, policy, tokenizer)

    out_dir = Path(config.trainer.out_dir)
    state = resume_or_start(out_dir, config.trainer.resume, model=policy,
                            optimizer=actor.optimizer, scheduler=actor.scheduler, dist=dist,
                            console=console)
    stream = QuestionStream(train_records, config.seed, config.data.shuffle, state)
    log = TrajectoryLog.from_config(
        config.trainer.log_trajectories, out_dir, records=train_records, dist=dist,
        rows_per_step=config.data.train_batch_size * config.rl.rollout_n,
        warn=warn_on_stderr(dist))
    return Run(config, task, engine, actor, reference, tokenizer, stream, state,
               val_records, dist, console, log)


def warn_on_stderr(dist: Dist) -> Callable[[str], None]:
    """One `warning: ...` line on stderr (main rank only)."""

    def warn(text: str) -> None:
        if dist.is_main:
            print(f"warning: {text}", file=sys.stderr, flush=True)

    return warn


def seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resume_or_start(
    out_dir: Path, resume: str, *, model: Any, optimizer: Any, scheduler: Any, dist: Dist,
    console: Any = None,
) -> TrainState:
    """The state to start from: the latest checkpoint's (loaded into the live objects) when
    resuming, else a fresh one; a fresh run refuses a directory that holds checkpoints."""
    latest = latest_checkpoint(out_dir / "checkpoints", warn=warn_on_stderr(dist))
    if resume == "auto" and latest is not None:
        saved = load_checkpoint(latest, model=model, optimizer=optimizer, scheduler=scheduler,
                                dist=dist)
        if dist.is_main:
            truncate_metrics(out_dir / "metrics.jsonl", saved["step"])
            remove_steps_after(out_dir, saved["step"])
            if console is not None:
                console.print(f"resumed from {latest} at step {saved['step']}")
        return TrainState(**{k: saved[k] for k in ("step", "epoch", "cursor")})
    if latest is not None:
        raise MemrlInputError(
            f"{out_dir / 'checkpoints'} already holds checkpoints: pass --resume "
            "(trainer.resume=auto) to continue, or choose another trainer.out_dir",
            location="trainer.out_dir",
        )
    if dist.is_main:  # a fresh run in a used directory
        if (out_dir / "metrics.jsonl").exists():
            truncate_metrics(out_dir / "metrics.jsonl", -1)
        remove_steps_after(out_dir, -1)
    return TrainState()

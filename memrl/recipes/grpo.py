"""GRPO-family RL for memory agents: the training recipe, top to bottom.

    for each step (`train_step`):
        engine.sync_weights(policy)                  the engine samples the current policy
        groups = collect_groups(task.rollout, ...)   rollouts + rewards; dynamic sampling
        batch  = RolloutBatch.from_trajectories(...)  one typed batch, one Conversation per turn
        old    = OldLogprobs.plan(run, batch)        the engine's, a separate pass's or the
                                                     update's own forward (on-policy)
        batch  = with_logprobs(run, batch, old)      old (a separate pass) and reference
                                                     log-probs
        batch  = with_advantages(batch, rl, dist)    one advantage per trajectory (grpo,
                                                     rloo, reinforce_plus_plus_baseline)
        stats  = actor.update(batch, dist, guard)    PPO's clipped objective over mini/micro-
                                                     batches; on-policy its forward gives
                                                     the old log-probs
        return step_record(...)                      trajectory rows, recipes/step_metrics.py

PPO with a value model (rl.adv_estimator gae) is its own recipe, `memrl.recipes.ppo`: its
step adds the critic's values, GAE and the critic's update, and shares the rest of this
module (setup, the loop, validation, checkpoints; `step_function` picks the step). The loop
around both (resume, validate, log, checkpoint) is `memrl.run.scaffold`, shared with the SFT
warm start. The task (agent + data + reward), the engine and the models come from the config
(`setup`); `memrl.rl` holds the maths and the trainer. docs/architecture.md traces one step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memrl.distributed import Dist, note
from memrl.inference.base import derive_seed
from memrl.recipes import models
from memrl.recipes.config import TrainConfig
from memrl.recipes.step_metrics import Phases, StepView, step_metrics
from memrl.rl.config import RLConfig
from memrl.rl.maths.advantages import compute_advantages
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.maths.correction import LogprobGuard
from memrl.rl.trainer.actor import Actor, Reference
from memrl.rl.trainer.critic import Critic
from memrl.rl.trainer.rollout import Groups, QuestionStream, TrainState, collect_groups
from memrl.rl.trainer.update_log import UpdateStats
from memrl.rl.trainer.values import CriticStats
from memrl.run.scaffold import (
    planned_steps,
    resume_or_start,
    run_loop,
    save_run,
    seed_everything,
    warn_on_stderr,
)
from memrl.run.trajectory_log import TrajectoryLog
from memrl.tasks import RolloutSpec, Task, build_task


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
    val_sets: dict[str, list[Any]] = field(default_factory=dict)
    """The questions of each of `data.val_sets`, by name."""
    stage: int = 0
    """The curriculum stage whose questions `stream` holds (`DataConfig.stage_at`)."""
    dist: Dist = Dist()
    console: Any = None
    trajectory_log: TrajectoryLog | None = None
    """Per-trajectory records of each step (`trainer.log_trajectories`); None: off."""
    critic: Critic | None = None
    """PPO's separate value model (rl.adv_estimator=gae); None for the group estimators and
    for a value head on the policy (`actor.value_head`)."""

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
    step = step_function(config)
    run_loop(config, run.state, run.dist, total=total_steps(config, len(run.stream.records)),
             step=lambda: step(run), validate=(lambda: validate(run))
             if run.val_records or run.val_sets else None, save=lambda: save(run))
    run.engine.close()
    return run.state


def step_function(config: TrainConfig) -> Callable[[Run], dict[str, float]]:
    """The recipe's step for `config`: PPO's (`memrl.recipes.ppo.train_step`) for
    rl.adv_estimator gae, else GRPO's (`train_step`); the loop around both is this module's."""
    if config.rl.adv_estimator == "gae":
        from memrl.recipes import ppo  # PPO's recipe is built on this one's pieces

        return ppo.train_step
    return train_step


def train_step(run: Run) -> dict[str, float]:
    """One step of GRPO (or RLOO, REINFORCE++ baseline: rl.adv_estimator); its metrics."""
    rl = run.config.rl
    phases = Phases(run.state.step + 1)  # heartbeat (what this rank is doing) and timings

    # 1-3. The engine syncs the current weights and samples rollout groups (+ DAPO dynamic
    # sampling, refilled); one typed batch: a Conversation per turn, a reward per trajectory.
    groups, batch = rollout_batch(run, phases)
    # The old log-probs: the engine's, a separate pass's, or the update's own forward.
    old = OldLogprobs.plan(run, batch)

    with phases("logprobs"):  # 4. Old (a separate pass) and reference log-probs (no grad).
        batch, entropy, mismatch = with_logprobs(run, batch, old)

    # 5. Rewards (minus a KL penalty, optionally) → one advantage per trajectory.
    task_rewards = batch.rewards
    batch = with_advantages(batch, rl, run.dist)

    # 6. PPO update: epochs × mini-batches × micro-batches, exact loss weights. On-policy
    # the guard checks the update's own old log-probs before its optimizer step.
    lr = run.actor.lr
    with phases("update"):
        update = run.actor.update(batch, run.dist, first_on_policy=old.first is not None,
                                  guard=old.update_guard)
    batch, entropy, mismatch = old.taken_by(update, batch, entropy, mismatch)

    with phases("metrics"):  # 7. Metrics (over every rank's share of the step).
        return step_record(run, phases, groups, batch, task_rewards, entropy, mismatch,
                           update=update, lr=lr)


def rollout_batch(run: Run, phases: Phases) -> tuple[Groups, RolloutBatch]:
    """The step's groups of trajectories, sampled by the engine from the current weights,
    and their typed batch."""
    rl = run.config.rl
    with phases("sync"):  # 1. The engine samples from the current weights.
        run.engine.wake()
        run.engine.sync_weights(run.actor.model, run.state.step)

    with phases("rollout"):  # 2. Rollout groups (+ DAPO dynamic sampling, refilled).
        groups = rollout_groups(run)
        run.engine.sleep()

    batch = RolloutBatch.from_trajectories(
        groups.trajectories, overlong=rl.overlong,
        group_order=groups.group_order if run.dist.world_size > 1 else None,
    )
    return groups, batch


def rollout_groups(run: Run) -> Groups:
    """`data.train_batch_size` groups of `rollout.n` scored trajectories, one group per
    question of the stream; with rl.dynamic_sampling, groups whose rewards are all equal are
    dropped and refilled from the next questions (DAPO)."""
    cfg, rl, rollout = run.config, run.config.rl, run.config.rollout
    enter_stage(run)
    return collect_groups(
        lambda records, seed: run.task.rollout(run.engine, records, RolloutSpec(
            rollout.n, seed, rollout.temperature, rollout.top_p, mode=rollout.mode)),
        run.stream,
        want=cfg.data.train_batch_size,
        dynamic_sampling=rl.dynamic_sampling,
        max_refill_rounds=rl.max_refill_rounds,
        round_seed=lambda r: derive_seed(cfg.seed, "train", run.state.step, r),
        dist=run.dist,
    )


def enter_stage(run: Run) -> None:
    """The stream of the next step's curriculum stage (`data.curriculum`): its file's
    questions, the data order carrying on (same epoch and cursor)."""
    cfg = run.config
    stage = cfg.data.stage_at(run.state.step + 1)
    if stage == run.stage:
        return
    path = cfg.data.train_file_at(run.state.step + 1)
    records = run.task.load(path, cfg.data.format, what="training")
    run.stream = QuestionStream(records, cfg.seed, cfg.data.shuffle, run.state)
    run.stage = stage
    if run.trajectory_log is not None:
        run.trajectory_log.add_records(records)
    run.say(f"curriculum: from step {run.state.step + 1}, stage {stage}: {path}")


def engine_guard(run: Run, batch: RolloutBatch) -> LogprobGuard:
    """The engine's log-probs of the batch and rollout.max_logprob_diff, the bound on their
    distance to the trainer's old log-probs."""
    cfg = run.config
    return LogprobGuard([torch.tensor(s.rollout_logprobs) for s in batch.conversations],
                        cfg.rollout.max_logprob_diff, engine=cfg.rollout.engine,
                        step=run.state.step + 1)


@dataclass(frozen=True)
class OldLogprobs:
    """Where a step's old log-probs come from (`RLConfig.old_logprob_source`): the engine's
    (rl.use_rollout_logprobs), a separate pass, or, where the step is on-policy (before its
    first optimizer step; rl.old_logprobs auto), the update's forward: for the whole batch
    (one mini-batch), or its first mini-batch (`first`; the same on every rank, though a
    rank's share of it may be empty). `guard`: the engine must sample the policy being
    trained."""

    source: str
    first: list[int] | None
    guard: LogprobGuard

    @classmethod
    def plan(cls, run: Run, batch: RolloutBatch) -> OldLogprobs:
        minis = batch.mini_batches(run.config.rl.ppo_mini_batch_size)
        source = run.config.rl.old_logprob_source(len(minis))
        return cls(source, minis[0] if source == "pass_and_update" else None,
                   engine_guard(run, batch))

    @property
    def update_guard(self) -> LogprobGuard | None:
        """The guard the update checks (its own forward gives old log-probs), else None."""
        return None if self.source in ("engine", "pass") else self.guard

    def taken_by(self, update: UpdateStats, batch: RolloutBatch,
                 entropy: list[torch.Tensor] | None, mismatch: dict[str, float]
                 ) -> tuple[RolloutBatch, list[torch.Tensor] | None, dict[str, float]]:
        """The batch, entropies and mismatch with what the update took from its own forward
        (`update.old_pass`: the old log-probs it used), else as they were."""
        if update.old_pass is None:
            return batch, entropy, mismatch
        taken = set(self.first) if self.first is not None else range(len(batch.conversations))
        entropy = [update.old_pass.entropy[i] if i in taken else e
                   for i, e in enumerate(entropy or update.old_pass.entropy)]
        return (batch.with_logprobs(update.old_pass.logprobs, batch.ref_logprobs), entropy,
                update.old_pass.mismatch)


OldPassFn = Callable[[RolloutBatch, list[int]], tuple[list[torch.Tensor], list[torch.Tensor]]]
"""The separate old log-prob pass over some conversations: (log-probs, entropies)."""


def with_logprobs(run: Run, batch: RolloutBatch, old: OldLogprobs,
                  old_pass: OldPassFn | None = None,
                  ) -> tuple[RolloutBatch, list[torch.Tensor] | None, dict[str, float]]:
    """The batch with its old log-probs from `old.source` (the engine's, a separate pass, or
    none yet: the update's forward gives them) and its reference log-probs; the entropies
    of the separate pass (else None); and, after that pass, the engine's mismatch with the
    trainer (`old.guard`: `rollout/logprob_diff_*`), which stops the run past
    rollout.max_logprob_diff (on every rank, or none). `pass_and_update`: the pass skips the
    conversations of `old.first` (the first mini-batch), whose old log-probs are NaN
    placeholders until the update takes them from its forward (and checks the guard there).
    `old_pass`: the separate pass (default: the actor's `logprobs_and_entropy`)."""
    ref = run.reference.logprobs(batch) if run.reference is not None else None
    if old.source == "engine":
        return batch.with_logprobs(old.guard.engine_logprobs, ref), None, {}
    if old.source == "update":
        return batch.with_logprobs(None, ref), None, {}
    skip = set(old.first or ())  # pass_and_update: the guard is the update's (a collective)
    rest = [i for i in range(len(batch.conversations)) if i not in skip]
    logprobs, entropy = (old_pass or run.actor.logprobs_and_entropy)(batch, rest)
    if old.first is not None:
        logprobs = [torch.full((len(s.response_ids),), math.nan) if i in skip else logprobs[i]
                    for i, s in enumerate(batch.conversations)]
        return batch.with_logprobs(logprobs, ref), entropy, {}
    return batch.with_logprobs(logprobs, ref), entropy, old.guard.check(logprobs, run.dist)


def with_rewards_less_kl(batch: RolloutBatch, rl: RLConfig) -> RolloutBatch:
    """The batch's rewards less the KL penalty to the reference (rl.use_kl_in_reward)."""
    if rl.use_kl_in_reward and rl.kl_reward_coef > 0:
        return batch.with_rewards(batch.rewards - rl.kl_reward_coef * batch.kl(rl.kl_penalty))
    return batch


def with_advantages(batch: RolloutBatch, rl: RLConfig, dist: Dist = Dist()) -> RolloutBatch:
    """The batch's rewards less the KL penalty (rl.use_kl_in_reward), and one advantage per
    trajectory from them (rl.adv_estimator: a group estimator). The batch-wide whitening of
    reinforce_plus_plus_baseline is over every rank's share of the step (`dist`)."""
    batch = with_rewards_less_kl(batch, rl)
    return batch.with_advantages(
        compute_advantages(
            rl.adv_estimator,
            batch.rewards,
            batch.group_ids,
            token_counts=batch.response_tokens,
            norm_by_std=rl.norm_adv_by_std,
            size1=rl.size1_group_advantage,
            all_reduce_sum=dist.all_reduce_sum,
        )
    )


def step_record(run: Run, phases: Phases, groups: Groups, batch: RolloutBatch,
                task_rewards: torch.Tensor, entropy: list[torch.Tensor] | None,
                mismatch: dict[str, float], *, update: UpdateStats, lr: float,
                critic: CriticStats | None = None) -> dict[str, float]:
    """The step's trajectory rows (trainer.log_trajectories; gathered on the main rank) and
    its metrics, over every rank's share of the step."""
    view = StepView.of(groups.trajectories, batch, task_rewards).gathered(
        run.dist, groups.group_order)
    if run.trajectory_log is not None:
        run.trajectory_log.write(phases.step, groups.trajectories, batch, task_rewards,
                                 groups.group_order, entropy)
    return step_metrics(view, run.task, phases, groups_generated=groups.generated, lr=lr,
                        mismatch=mismatch, update=update, ppo_epochs=run.config.rl.ppo_epochs,
                        critic=critic)


def validate(run: Run) -> dict[str, float]:
    """Score the validation questions (val_file: `val/...`; each of data.val_sets:
    `val_<name>/...`) with the current policy; log sample trajectories of each."""
    run.engine.wake()
    run.engine.sync_weights(run.actor.model, run.state.step)
    metrics = validate_set(run, run.val_records, "val") if run.val_records else {}
    for name, records in run.val_sets.items():
        metrics |= validate_set(run, records, f"val_{name}", name)
    scores = ", ".join(f"{k.removesuffix('/score')} {v:.3f}" for k, v in metrics.items()
                       if k.endswith("/score"))
    run.say(f"validation @ step {run.state.step}: {scores}")
    return metrics


def validate_set(run: Run, records: list[Any], prefix: str, name: str | None = None
                 ) -> dict[str, float]:
    """One validation set's metrics (`<prefix>/score`, the task's summary) and its logged
    samples (val_samples/step_NNNNNN[_<name>].jsonl)."""
    cfg, val = run.config, run.config.rollout.val
    mine = run.dist.shard(records)
    seed = derive_seed(cfg.seed, "val", run.state.step) if name is None else derive_seed(
        cfg.seed, "val", name, run.state.step)
    trajs = run.task.rollout(run.engine, mine, RolloutSpec(
        val.n, seed, val.temperature, cfg.rollout.top_p if val.top_p is None else val.top_p,
        mode=cfg.rollout.mode)) if mine else []
    if run.dist.world_size > 1:  # every rank's share, in the validation set's order
        where = {r.id: i for i, r in enumerate(records)}
        trajs = sorted((t for part in run.dist.all_gather(trajs) for t in part),
                       key=lambda t: (where[t.record_id], t.sample_index))
    metrics = {
        f"{prefix}/score": float(np.mean([t.reward for t in trajs])),
        **{f"{prefix}/{key}": v for key, v in run.task.summarize(trajs).items()},
    }
    k = cfg.trainer.num_logged_trajectories
    if k and run.dist.is_main:
        from memrl.eval.report import write_jsonl

        by_id = {r.id: r for r in records}
        rows = [run.task.log_row(t, by_id[t.record_id]) for t in trajs[:k]]
        suffix = "" if name is None else f"_{name}"
        write_jsonl(run.out_dir / "val_samples" / f"step_{run.state.step:06d}{suffix}.jsonl",
                    rows)
    return metrics


def save(run: Run) -> Path | None:
    """A checkpoint of the policy, optimizer, schedule, RNG and data cursor, and the critic
    (PPO: the separate one, or the value head on the policy, whose AdamW state is in the
    actor's) (every rank takes part; the next step starts once it is complete)."""
    return save_run(run.config, run.state, model=run.actor.model, optimizer=run.actor.optimizer,
                    scheduler=run.actor.scheduler, tokenizer=run.tokenizer, dist=run.dist,
                    critic=run.critic or run.actor.value_head)


def total_steps(config: TrainConfig, num_records: int) -> int:
    return planned_steps(config.trainer, num_records, config.data.train_batch_size)


def setup(
    config: TrainConfig, *, task: Task | None = None, dist: Dist | None = None, console: Any = None
) -> Run:
    """Data, policy (+LoRA), reference, engine, optimizer; resume from a checkpoint.

    Without `dist` it joins the launcher's process group as `train` does (one process of
    model.strategy fsdp: a group of one), so a script may call it directly; such a caller
    ends it with `memrl.distributed.destroy_process_group()`."""
    seed_everything(config.seed)
    if dist is None:
        from memrl.distributed import init_process_group

        dist = init_process_group(config.trainer.dist_timeout_s, device=config.model.device,
                                  always=config.model.strategy == "fsdp")
    task = task if task is not None else build_task(config)
    data = config.data
    train_records = task.load(data.train_file, data.format, what="training")
    val_records: list[Any] = []
    if data.val_file:
        val_records = task.load(data.val_file, data.format, what="validation")
        val_records = val_records[: data.val_limit]
    val_sets = {name: task.load(path, data.format, what=f"validation ({name})")[: data.val_limit]
                for name, path in data.val_sets.items()}

    policy, tokenizer = models.load_policy(config.model)
    temperature = config.rollout.temperature
    actor = models.build_actor(config, policy, tokenizer, temperature, dist,
                               total_steps=total_steps(config, len(train_records)))
    reference = models.build_reference(config, policy, tokenizer, temperature, dist)
    engine = models.build_engine(config, policy, tokenizer)
    critic = models.build_critic(config, tokenizer, dist,
                                 total_steps=total_steps(config, len(train_records)))
    if critic is not None:
        critic.replicate(dist)  # one value head on every rank (a checkpoint may replace it)

    out_dir = Path(config.trainer.out_dir)
    state = resume_or_start(out_dir, config.trainer.resume, model=policy,
                            optimizer=actor.optimizer, scheduler=actor.scheduler, dist=dist,
                            console=console, critic=critic or actor.value_head)
    stream = QuestionStream(train_records, config.seed, config.data.shuffle, state)
    log = TrajectoryLog.from_config(
        config.trainer.log_trajectories, out_dir, records=train_records, dist=dist,
        rows_per_step=config.data.train_batch_size * config.rollout.n,
        warn=warn_on_stderr(dist))
    run = Run(config, task, engine, actor, reference, tokenizer, stream, state,
              val_records=val_records, val_sets=val_sets, dist=dist, console=console,
              trajectory_log=log, critic=critic)
    enter_stage(run)  # a run resumed in a later stage of the curriculum
    return run

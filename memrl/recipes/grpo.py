"""GRPO-family RL for memory agents: the training recipe, top to bottom.

    for each step (`train_step`):
        engine.sync_weights(policy)                  the engine samples the current policy
        groups = collect_groups(task.rollout, ...)   rollouts + rewards; dynamic sampling
        batch  = RolloutBatch.from_trajectories(...)  one typed batch, one Conversation per turn
        batch  = with_logprobs(run, batch, source)   old (actor; on-policy: none, below) and
                                                     reference log-probs (+ critic's values)
        batch  = with_advantages(batch, rl, dist)    one advantage per trajectory (GAE:
                                                     per token, memrl.rl.gae)
        stats  = actor.update(batch, dist, guard)    PPO over mini/micro-batches; on-policy
                                                     its forward gives the old log-probs
        critic = run.critic.update(batch, dist)      PPO: the value model (else None; a
                                                     value head on the policy trains in
                                                     the actor's update)
        return step_metrics(...)                     recipes/step_metrics.py

The loop around it (resume, validate, log, checkpoint) is `recipes/scaffold.py`, shared
with the SFT warm start. The task (agent + data + reward), the engine and the models come
from the config (`setup`); `memrl.rl` holds the maths and the actor.
docs/architecture.md traces one step.
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
from memrl.recipes.scaffold import (
    planned_steps,
    resume_or_start,
    run_loop,
    save_run,
    seed_everything,
    warn_on_stderr,
)
from memrl.recipes.step_metrics import Phases, StepView, step_metrics
from memrl.recipes.trajectory_log import TrajectoryLog
from memrl.rl.actor import Actor, Reference
from memrl.rl.advantages import compute_advantages
from memrl.rl.batch import RolloutBatch
from memrl.rl.config import RLConfig
from memrl.rl.critic import Critic
from memrl.rl.gae import gae_batch
from memrl.rl.correction import LogprobGuard
from memrl.rl.rollout import Groups, QuestionStream, TrainState, collect_groups
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
    run_loop(config, run.state, run.dist, total=total_steps(config, len(run.stream.records)),
             step=lambda: train_step(run), validate=(lambda: validate(run))
             if run.val_records or run.val_sets else None, save=lambda: save(run))
    run.engine.close()
    return run.state


def train_step(run: Run) -> dict[str, float]:
    """One step of the algorithm; returns its metrics."""
    rl = run.config.rl
    phases = Phases(run.state.step + 1)  # heartbeat (what this rank is doing) and timings

    with phases("sync"):  # 1. The engine samples from the current weights.
        run.engine.wake()
        run.engine.sync_weights(run.actor.model, run.state.step)

    with phases("rollout"):  # 2. Rollout groups (+ DAPO dynamic sampling, refilled).
        groups = rollout_groups(run)
        run.engine.sleep()

    # 3. One typed batch: a Conversation per turn, a reward per trajectory.
    batch = RolloutBatch.from_trajectories(
        groups.trajectories, overlong=rl.overlong,
        group_order=groups.group_order if run.dist.world_size > 1 else None,
    )

    # The old log-probs: the engine's (rl.use_rollout_logprobs), a separate pass, or, where
    # the step is on-policy (before its first optimizer step; rl.old_logprobs auto), the
    # update's forward: for the whole batch (one mini-batch), or its first mini-batch.
    minis = batch.mini_batches(rl.ppo_mini_batch_size)
    source = rl.old_logprob_source(len(minis))
    # (the same on every rank, though a rank's share of the first may be empty)
    first = minis[0] if source == "pass_and_update" else None
    guard = engine_guard(run, batch)  # the engine must sample the policy being trained

    with phases("logprobs"):  # 4. Old (a separate pass) and reference log-probs (no grad).
        batch, entropy, mismatch = with_logprobs(run, batch, source, guard, first)

    # 5. Rewards (minus a KL penalty, optionally) → one advantage per trajectory.
    task_rewards = batch.rewards
    batch = with_advantages(batch, rl, run.dist)

    # 6. PPO update: epochs × mini-batches × micro-batches, exact loss weights. On-policy
    # the guard checks the update's own old log-probs before its optimizer step.
    lr = run.actor.lr
    with phases("update"):
        update = run.actor.update(batch, run.dist, first_on_policy=first is not None,
                                  guard=None if source in ("engine", "pass") else guard)
        # the separate critic's update (PPO), or the value head's share of the actor's
        critic = run.critic.update(batch, run.dist) if run.critic is not None else update.critic
    if update.old_pass is not None:  # the batch gets the old log-probs the update used
        batch = batch.with_logprobs(update.old_pass.logprobs, batch.ref_logprobs)
        mismatch = update.old_pass.mismatch
        taken = set(first) if first is not None else range(len(batch.conversations))
        entropy = [update.old_pass.entropy[i] if i in taken else e
                   for i, e in enumerate(entropy or update.old_pass.entropy)]

    with phases("metrics"):  # 7. Metrics (over every rank's share of the step).
        view = StepView.of(groups.trajectories, batch, task_rewards).gathered(
            run.dist, groups.group_order)
        if run.trajectory_log is not None:  # a row per trajectory, gathered on the main rank
            run.trajectory_log.write(phases.step, groups.trajectories, batch, task_rewards,
                                     groups.group_order, entropy)
        return step_metrics(view, run.task, phases, groups_generated=groups.generated, lr=lr,
                            mismatch=mismatch, update=update, ppo_epochs=rl.ppo_epochs,
                            critic=critic)


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


def with_logprobs(run: Run, batch: RolloutBatch, source: str, guard: LogprobGuard,
                  first: list[int] | None = None,
                  ) -> tuple[RolloutBatch, list[torch.Tensor] | None, dict[str, float]]:
    """The batch with its old log-probs from `source` (`RLConfig.old_logprob_source`: the
    engine's, a separate pass, or none yet: the update's forward gives them) and its
    reference log-probs (and the critic's values: PPO; a value head on the policy reads
    them in the old log-prob pass, else in a pass of their own); the entropies of the
    separate pass (else None); and, after that pass, the engine's mismatch with the trainer
    (`guard`: `rollout/logprob_diff_*`), which stops the run past rollout.max_logprob_diff
    (on every rank, or none). `pass_and_update`: the pass skips the conversations of
    `first` (the first mini-batch), whose old log-probs are NaN placeholders until the
    update takes them from its forward (and checks the guard there)."""
    ref = run.reference.logprobs(batch) if run.reference is not None else None
    head = run.actor.value_head is not None  # critic.value_model policy_head
    if run.critic is not None:
        batch = batch.with_values(run.critic.values(batch))
    elif head and source not in ("pass", "pass_and_update"):  # no old pass to read them in
        batch = batch.with_values(run.actor.values(batch))
    if source == "engine":
        return batch.with_logprobs(guard.engine_logprobs, ref), None, {}
    if source == "update":
        return batch.with_logprobs(None, ref), None, {}
    skip = set(first or ())  # pass_and_update: the guard is the update's (a collective)
    rest = [i for i in range(len(batch.conversations)) if i not in skip]
    if head:  # the values from the old log-prob pass's own forward
        old, entropy, values = run.actor.logprobs_entropy_and_values(batch, rest)
        if first is not None:  # and the first mini-batch's from a pass of their own
            own = run.actor.values(batch, sorted(skip))
            values = [own[i] if i in skip else v for i, v in enumerate(values)]
        batch = batch.with_values(values)
    else:
        old, entropy = run.actor.logprobs_and_entropy(batch, rest)
    if first is not None:
        old = [torch.full((len(s.response_ids),), math.nan) if i in skip else old[i]
               for i, s in enumerate(batch.conversations)]
        return batch.with_logprobs(old, ref), entropy, {}
    return batch.with_logprobs(old, ref), entropy, guard.check(old, run.dist)


def with_advantages(batch: RolloutBatch, rl: RLConfig, dist: Dist = Dist()) -> RolloutBatch:
    """The batch's rewards less the KL penalty (rl.use_kl_in_reward), and one advantage per
    trajectory from them (rl.adv_estimator); gae: per-token advantages and returns from the
    critic's values (`gae_batch`). The batch-wide whitening of gae and
    reinforce_plus_plus_baseline is over every rank's share of the step (`dist`)."""
    if rl.use_kl_in_reward and rl.kl_reward_coef > 0:
        batch = batch.with_rewards(batch.rewards - rl.kl_reward_coef * batch.kl(rl.kl_penalty))
    if rl.adv_estimator == "gae":
        return gae_batch(batch, gamma=rl.gamma, lam=rl.lam, all_reduce_sum=dist.all_reduce_sum)
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

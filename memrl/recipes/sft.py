"""Warm start: supervised fine-tuning on teacher trajectories, top to bottom.

    trajectories = teacher_trajectories(...)       oracle rollouts, or a trajectories file
                                                    filtered by score (rejection sampling)
    for each step:
        batch = RolloutBatch.from_trajectories(stream.take(batch_size))   as in RL
        loss  = sft_loss(response log-probs, mask, response tokens of the step)
        optimizer_step(...)                        grad clip, skip non-finite, schedule
        if dist.is_main: log, validate (val/nll), checkpoint

The batch, the log-probs, the optimizer step (`memrl.rl.trainer.optim`), the schedule, the run
loop, the checkpoints and resuming (`memrl.run.scaffold`) and the data cursor are
those of `memrl.recipes.grpo`, so `memrl sft --resume` continues a killed run exactly
and its checkpoint is a policy `memrl train` can start from (`memrl export` first).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from memrl.data.io import expect_object, iter_jsonl
from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.recipes import models
from memrl.recipes.sft_config import SFTConfig
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.trainer.actor import response_logprobs
from memrl.rl.trainer.optim import build_optimizer, optimizer_step
from memrl.rl.trainer.rollout import QuestionStream, TrainState
from memrl.run.scaffold import (
    planned_steps,
    resume_or_start,
    run_loop,
    save_run,
    seed_everything,
)
from memrl.tasks import CanReplay, HasOracle, RolloutSpec, Task, build_task
from memrl.trajectory import Trajectory


def sft_loss(logprobs: Tensor, mask: Tensor, num_tokens: float | Tensor) -> Tensor:
    """Negative log-likelihood of the masked (response) tokens, summed and divided by
    `num_tokens`: the step's response-token count, so micro-batch losses add up to the
    step's token mean."""
    return -(logprobs * mask).sum() / num_tokens


@dataclass
class SFTRun:
    config: SFTConfig
    model: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    stream: QuestionStream
    state: TrainState
    val: list[Trajectory]
    dist: Dist = Dist()


def sft_total_steps(config: SFTConfig, num_trajectories: int) -> int:
    """The run's training steps: `trainer.total_steps`, else its epochs over the trajectories."""
    return planned_steps(config.trainer, num_trajectories, config.sft.batch_size)


def train(config: SFTConfig, *, dist: Dist | None = None, console: Any = None) -> TrainState:
    """Fine-tune to `trainer.total_steps` (or epochs) on the teacher's trajectories."""
    run = setup(config, dist=dist, console=console)
    run_loop(config, run.state, run.dist, total=sft_total_steps(config, len(run.stream.records)),
             step=lambda: train_step(run),
             validate=(lambda: {"val/nll": validate(run)}) if run.val else None,
             save=lambda: save(run), console=console)
    return run.state


def train_step(run: SFTRun) -> dict[str, float]:
    """One optimizer step on the next `sft.batch_size` trajectories (this rank's share)."""
    t0 = time.perf_counter()
    trajs = run.dist.shard(run.stream.take(run.config.sft.batch_size))
    batch = RolloutBatch.from_trajectories(trajs, overlong="keep")
    tokens = run.dist.all_reduce_sum(sum(s.num_loss_tokens for s in batch.conversations))
    lr = float(run.optimizer.param_groups[0]["lr"])
    run.model.train()
    run.optimizer.zero_grad(set_to_none=True)
    loss = 0.0
    k, n = run.config.sft.micro_batch_size, len(batch.conversations)
    device = next(run.model.parameters()).device
    for start in range(0, n, k):
        tensors = batch.collate(range(start, min(start + k, n)), models.pad_token_id(run.tokenizer))
        with models.autocast(run.config.model, device):
            logprobs, _ = response_logprobs(run.model, tensors)
        part = sft_loss(logprobs, tensors["loss_mask"].to(logprobs.device), max(tokens, 1))
        part.backward()
        loss += float(part.detach())
    grad_norm = optimizer_step(run.model, run.optimizer, run.config.optim.grad_clip,
                               scheduler=run.scheduler)
    return {
        "train/nll": run.dist.all_reduce_sum(loss),
        "train/tokens": float(tokens),
        "train/samples": float(n),
        "train/lr": lr,
        "actor/grad_norm": grad_norm,
        "perf/step_time_s": time.perf_counter() - t0,
    }


@torch.no_grad()
def validate(run: SFTRun) -> float:
    """Token-mean NLL of the validation trajectories' responses."""
    batch = RolloutBatch.from_trajectories(run.val, overlong="keep")
    total, tokens, k = 0.0, 0, run.config.sft.micro_batch_size
    run.model.eval()
    device = next(run.model.parameters()).device
    for start in range(0, len(batch.conversations), k):
        tensors = batch.collate(range(start, min(start + k, len(batch.conversations))),
                                models.pad_token_id(run.tokenizer))
        with models.autocast(run.config.model, device):
            logprobs, _ = response_logprobs(run.model, tensors)
        mask = tensors["loss_mask"].to(logprobs.device)
        total += float(sft_loss(logprobs, mask, 1.0))
        tokens += int(mask.sum())
    run.model.train()
    return total / max(tokens, 1)


def save(run: SFTRun) -> Path | None:
    """A checkpoint of the run, written by the main rank alone (SFT's weights are never
    sharded); the other ranks return None at once."""
    if not run.dist.is_main:
        return None
    return save_run(run.config, run.state, model=run.model, optimizer=run.optimizer,
                    scheduler=run.scheduler, tokenizer=run.tokenizer, dist=Dist())


def teacher_task(config: SFTConfig) -> Task:
    """The task to warm-start, checked before any model is loaded: it needs an oracle
    (`Task.oracle`) for the training file without `data.trajectories` and for
    `data.val_file`, and a `Task.replay` when `data.trajectories` is given."""
    task = build_task(config)
    needs_oracle = config.data.trajectories is None or config.data.val_file is not None
    if needs_oracle and not isinstance(task, HasOracle):
        raise MemrlInputError(
            f"agent {config.agent} has no oracle to warm-start from (Task.oracle); give "
            "data.trajectories, a trajectories file to imitate", location="agent")
    if config.data.trajectories is not None and not isinstance(task, CanReplay):
        raise MemrlInputError(f"agent {config.agent} cannot replay a trajectories file "
                              "(Task.replay)", location="data.trajectories")
    return task


def teacher_trajectories(config: SFTConfig, tokenizer: Any, file: str, *, what: str,
                         replay: str | None = None, task: Task | None = None
                         ) -> list[Trajectory]:
    """The task's oracle's trajectories on the records of `file` (`Task.oracle`), or
    (`replay`: a trajectories file) its lines replayed over them (`Task.replay`), keeping
    those whose `scores[data.score_key]` reaches `data.min_score`."""
    dcfg = config.data
    task = task if task is not None else teacher_task(config)
    records = task.load(file, dcfg.format, what=what)
    if replay is None:
        return task.rollout(task.oracle(tokenizer, records), records,
                            RolloutSpec(seed=config.seed))
    by_id, kept = {r.id: r for r in records}, []
    for line, value in iter_jsonl(replay):
        row = expect_object(value, f"{replay}:{line}", "trajectory")
        if str(row.get("id")) not in by_id:
            raise MemrlInputError(f"question id {row.get('id')!r} is not in {file}",
                                  location=f"{replay}:{line}")
        score = float((row.get("scores") or {}).get(dcfg.score_key, 0.0))
        if score >= dcfg.min_score:
            traj = task.replay(tokenizer, by_id[str(row["id"])], row)
            kept.append(dataclasses.replace(traj, reward=score))
    if not kept:
        raise MemrlInputError(f"no trajectory scores {dcfg.score_key} >= {dcfg.min_score}",
                              location=replay)
    return kept


def setup(config: SFTConfig, *, dist: Dist | None = None, console: Any = None) -> SFTRun:
    """Teacher trajectories, policy, optimizer; resume from the latest checkpoint."""
    seed_everything(config.seed)
    dist = dist or Dist.from_environment()
    task = teacher_task(config)
    model, tokenizer = models.load_policy(config.model)
    trajs = teacher_trajectories(config, tokenizer, config.data.train_file, what="training",
                                 replay=config.data.trajectories, task=task)
    val = []
    if config.data.val_file:
        val = teacher_trajectories(config, tokenizer, config.data.val_file, what="validation",
                                   task=task)
    optim = config.optim
    optimizer = build_optimizer(model, lr=optim.lr, betas=optim.betas,
                                weight_decay=optim.weight_decay)
    scheduler = models.lr_schedule(optimizer, optim, sft_total_steps(config, len(trajs)))
    out = Path(config.trainer.out_dir)
    state = resume_or_start(out, config.trainer.resume, model=model, optimizer=optimizer,
                            scheduler=scheduler, dist=dist, console=console)
    kinds = config.sft.turn_kinds
    if kinds is not None:
        trajs, val = ([dataclasses.replace(t, turns=[u for u in t.turns if u.kind in kinds])
                       for t in part] for part in (trajs, val))
    stream = QuestionStream(trajs, config.seed, config.data.shuffle, state)
    return SFTRun(config, model, tokenizer, optimizer, scheduler, stream, state, val, dist)

"""The run scaffold every recipe shares (GRPO in `grpo`, the SFT warm start in `sft`):

    seed_everything(config.seed)                    before any model is built
    state = resume_or_start(out_dir, ...)           the latest checkpoint, or a fresh start
    run_loop(config, state, dist, total=..., step=..., validate=..., save=...)
        config.yaml; validate at step 0; then until `total`: metrics = step(), validate and
        checkpoint on the trainer's cadence, log (metrics.jsonl + sinks); training.png
    save_run(config, state, model=..., ...)         one checkpoint of the run

A recipe brings its setup and its step; the loop, the log, the checkpoints and resuming
are the same for every recipe, so every recipe's `--resume` continues a killed run exactly.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from memrl.config import config_to_yaml
from memrl.distributed import Dist, note
from memrl.errors import MemrlInputError
from memrl.fileio import write_atomic
from memrl.rl.trainer.rollout import TrainState
from memrl.run.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from memrl.run.metrics import (
    MetricsLogger,
    plot_training_curves,
    scrub_env_secrets,
    truncate_metrics,
)
from memrl.run.trajectory_files import remove_steps_after


def seed_everything(seed: int) -> None:
    import random

    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def planned_steps(trainer: Any, num_items: int, batch_size: int) -> int:
    """The run's training steps: `trainer.total_steps`, else `trainer.total_epochs` epochs
    of `num_items // batch_size` steps (at least one)."""
    if trainer.total_steps is not None:
        return trainer.total_steps
    return max(1, num_items // batch_size) * trainer.total_epochs


def warn_on_stderr(dist: Dist) -> Callable[[str], None]:
    """One `warning: ...` line on stderr (main rank only)."""

    def warn(text: str) -> None:
        if dist.is_main:
            print(f"warning: {text}", file=sys.stderr, flush=True)

    return warn


def resume_or_start(
    out_dir: Path, resume: str, *, model: Any, optimizer: Any, scheduler: Any, dist: Dist,
    console: Any = None, critic: Any = None,
) -> TrainState:
    """The state to start from: the latest checkpoint's (loaded into the live objects) when
    resuming, else a fresh one; a fresh run refuses a directory that holds checkpoints."""
    latest = latest_checkpoint(out_dir / "checkpoints", warn=warn_on_stderr(dist))
    if resume == "auto" and latest is not None:
        saved = load_checkpoint(latest, model=model, optimizer=optimizer, scheduler=scheduler,
                                dist=dist, critic=critic)
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


def save_run(
    config: Any, state: TrainState, *, model: Any, optimizer: Any, scheduler: Any,
    tokenizer: Any, dist: Dist, critic: Any = None,
) -> Path | None:
    """A checkpoint of the policy, optimizer, schedule, RNG and data cursor at `state.step`
    in `trainer.out_dir/checkpoints` (every rank of `dist` takes part; see
    `memrl.run.checkpoint.save_checkpoint`)."""
    return save_checkpoint(
        Path(config.trainer.out_dir) / "checkpoints",
        state.step,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        tokenizer=tokenizer,
        trainer_state=asdict(state),
        config_yaml=config_to_yaml(config),
        keep_last=config.trainer.keep_last,
        dist=dist,
        critic=critic,
    )


def run_loop(
    config: Any,
    state: TrainState,
    dist: Dist,
    *,
    total: int,
    step: Callable[[], dict[str, float]],
    validate: Callable[[], dict[str, float]] | None,
    save: Callable[[], object],
    console: Any = None,
) -> None:
    """Train from `state.step` to `total`: each `step()`'s metrics, with `validate()`'s on
    the `trainer.test_freq` cadence and at the last step (and at step 0 with
    `trainer.val_before_train`), logged to the trainer's sinks on the main rank (`console`:
    where the console sink prints; None: a fresh one); `save()` on the `trainer.save_freq`
    cadence and at the last step. `validate` None: no validation set. With
    `trainer.gc_freeze` the heap is frozen after the first step (when more follow) and
    unfrozen when the loop ends (`HeapFreezer`)."""
    tcfg, out = config.trainer, Path(config.trainer.out_dir)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "config.yaml", scrub_env_secrets(config_to_yaml(config)))
    with MetricsLogger(out, tcfg.log_sinks if dist.is_main else [], console=console,
                       console_every=tcfg.console_every,
                       run_config=config.model_dump(mode="json"),
                       wandb_project=tcfg.wandb_project) as logger:
        if state.step == 0 and tcfg.val_before_train and validate is not None:
            note("validation")
            logger.log(0, validate())
        with HeapFreezer(tcfg.gc_freeze) as heap:
            while state.step < total:
                metrics = step()
                state.step += 1
                if state.step < total:  # after the step that compiled (if any)
                    heap.after_step()
                _after_step(config, state, metrics, logger, total, validate, save)
    if dist.is_main:
        plot_training_curves(out / "metrics.jsonl", out / "training.png")


def _after_step(config: Any, state: TrainState, metrics: dict[str, float], logger: Any,
                total: int, validate: Callable[[], dict[str, float]] | None,
                save: Callable[[], object]) -> None:
    """A step's validation (on the cadence and at the last step), log row and checkpoint."""
    tcfg = config.trainer
    if validate is not None and (
        (tcfg.test_freq and state.step % tcfg.test_freq == 0) or state.step == total
    ):
        note("validation", state.step)
        metrics.update(validate())
    logger.log(state.step, metrics)
    if (tcfg.save_freq and state.step % tcfg.save_freq == 0) or state.step == total:
        note("checkpoint", state.step)
        save()


class HeapFreezer:
    """`trainer.gc_freeze` for a training loop: `after_step()` collects once and moves every
    object alive to Python's permanent generation (`gc.freeze`), so later collections skip
    them; leaving the `with` block (also on an error) unfreezes the whole heap if it froze
    it, including what an in-process vLLM engine froze when it started."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.frozen = enabled, False

    def __enter__(self) -> HeapFreezer:
        return self

    def after_step(self) -> None:
        """Freeze the heap, the first time only."""
        if self.enabled and not self.frozen:
            self.frozen = True  # first: an interrupt during the collection still unfreezes
            gc.collect()
            gc.freeze()

    def __exit__(self, *exc: object) -> None:
        if self.frozen:
            self.frozen = False
            gc.unfreeze()

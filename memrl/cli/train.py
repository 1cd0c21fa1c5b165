"""`memrl train CONFIG.yaml [key.path=value ...] [--resume]`."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import typer

from memrl.cli.app import app


@app.command("train")
def train(
    config: Path = typer.Argument(..., help="Training config (YAML)."),
    overrides: list[str] = typer.Argument(
        None, help="Dotted overrides, e.g. rl.rollout_n=8 memagent.chunk_size=512"
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the latest checkpoint (trainer.resume=auto)."
    ),
    nproc_per_node: int = typer.Option(
        1,
        "--nproc-per-node",
        min=1,
        help="Train on N processes of this machine (data parallel; one GPU each on CUDA): "
        "memrl starts `torchrun --standalone --nproc-per-node N` on itself.",
    ),
) -> None:
    """Train a memory agent with GRPO-family RL.

    Ctrl-C or SIGTERM stops the run with one line saying at which step it stopped, its last
    complete checkpoint and the command that continues from it; exit code 130 / 143.
    """
    from rich.console import Console

    from memrl.config import load_config
    from memrl.fileio import check_output_dir
    from memrl.interrupt import exit_on_signals
    from memrl.recipes import grpo
    from memrl.recipes.config import TrainConfig

    from memrl.distributed import destroy_process_group, launched, relaunch

    extra = list(overrides or [])
    if resume:
        extra.append("trainer.resume=auto")
    cfg = load_config(TrainConfig, config, extra)
    on_ray = cfg.trainer.launcher == "ray"
    check_launcher(on_ray, nproc_per_node)
    if nproc_per_node > 1 and not launched():
        raise typer.Exit(
            relaunch(nproc_per_node, ["train", str(config), *(overrides or []),
                                      *(["--resume"] if resume else [])])
        )
    out_dir = Path(cfg.trainer.out_dir)
    check_output_dir(out_dir, location=f"trainer.out_dir {out_dir}")
    console = Console()
    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        ranks = f" on {cfg.trainer.ray.num_workers} Ray workers" if on_ray else ""
        console.print(f"training → {out_dir}{ranks}")
    progress = TrainProgress(out_dir, on_ray=on_ray)
    how = "continue with: " + resume_command(config, list(overrides or []))
    try:
        with record_training("train", cfg, cfg.rollout.engine), \
                exit_on_signals(progress.describe, how):
            if on_ray:
                from memrl.ray_launcher import train_on_ray

                state = train_on_ray(cfg, train_rank)
            else:
                state = grpo.train(cfg, console=console, on_start=progress.started)
    finally:
        destroy_process_group()
    if not main_rank:
        return
    console.print(
        f"done: {state.step} steps; metrics {out_dir / 'metrics.jsonl'}, "
        f"plot {out_dir / 'training.png'}"
    )


def record_training(kind: str, cfg: Any, engine: str | None) -> Any:
    """The run record (`memrl.runrecord`) of a training run in `trainer.out_dir`: world size
    and launcher (Ray's ranks, or torchrun's), strategy, engine, seed, config hash."""
    from memrl.runrecord import recorded

    on_ray = cfg.trainer.launcher == "ray"
    return recorded(
        cfg.trainer.out_dir, kind, config=cfg, seed=cfg.seed,
        world_size=cfg.trainer.ray.num_workers if on_ray else None,
        launcher=cfg.trainer.launcher, strategy=cfg.model.strategy, engine=engine,
        device=cfg.model.device,
    )


def train_rank(cfg: Any) -> Any:
    """One rank of a `trainer.launcher: ray` run: the recipe, printing on the main rank."""
    from rich.console import Console

    from memrl.recipes import grpo

    return grpo.train(cfg, console=Console())


def check_launcher(on_ray: bool, nproc_per_node: int) -> None:
    """MemrlInputError when two launchers are asked for at once."""
    from memrl.distributed import launched
    from memrl.errors import MemrlInputError

    if on_ray and nproc_per_node > 1:
        raise MemrlInputError(
            "starts torchrun, but trainer.launcher is ray: set the number of ranks with "
            "trainer.ray.num_workers", location="--nproc-per-node")
    if on_ray and launched():
        raise MemrlInputError(
            "is ray, but this process is already one rank of a launcher (torchrun): use "
            "trainer.launcher=local under torchrun", location="trainer.launcher")


def resume_command(config: Path, overrides: list[str], command: str = "train") -> str:
    """The command line that continues this run: `memrl train CONFIG [OVERRIDES] --resume`
    (`command` sft: `memrl sft ...`)."""
    args = ["memrl", command, str(config), *overrides, "--resume"]
    return " ".join(shlex.quote(a) for a in args)


class TrainProgress:
    """How far a run got, said when it is interrupted (see `memrl.interrupt`)."""

    def __init__(self, out_dir: Path, *, on_ray: bool = False) -> None:
        self.out_dir = out_dir
        self.on_ray = on_ray
        self.run: Any = None

    def started(self, run: Any) -> None:
        self.run = run

    def describe(self) -> str:
        from memrl.recipes.grpo import total_steps
        from memrl.rl.checkpoint import latest_checkpoint

        latest = latest_checkpoint(self.out_dir / "checkpoints")
        saved = f"last complete checkpoint: {latest}" if latest else "no checkpoint saved yet"
        if self.on_ray:  # the run lives in the Ray workers: say what is on disk
            return f"during the training run on Ray in {self.out_dir}; {saved}"
        if self.run is None:
            return f"while setting up the training run in {self.out_dir} (no step was run)"
        done = self.run.state.step
        total = total_steps(self.run.config, len(self.run.stream.records))
        where = (f"after the last step ({total} of {total})" if done >= total
                 else f"in step {done + 1} of {total}")
        return f"{where} of the training run in {self.out_dir}; {saved}"

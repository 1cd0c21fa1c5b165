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
        console.print(f"training → {out_dir}")
    progress = TrainProgress(out_dir)
    how = "continue with: " + resume_command(config, list(overrides or []))
    try:
        with exit_on_signals(progress.describe, how):
            state = grpo.train(cfg, console=console, on_start=progress.started)
    finally:
        destroy_process_group()
    if not main_rank:
        return
    console.print(
        f"done: {state.step} steps; metrics {out_dir / 'metrics.jsonl'}, "
        f"plot {out_dir / 'training.png'}"
    )


def resume_command(config: Path, overrides: list[str]) -> str:
    """The command line that continues this run: `memrl train CONFIG [OVERRIDES] --resume`."""
    args = ["memrl", "train", str(config), *overrides, "--resume"]
    return " ".join(shlex.quote(a) for a in args)


class TrainProgress:
    """How far a run got, said when it is interrupted (see `memrl.interrupt`)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.run: Any = None

    def started(self, run: Any) -> None:
        self.run = run

    def describe(self) -> str:
        from memrl.recipes.grpo import total_steps
        from memrl.rl.checkpoint import latest_checkpoint

        if self.run is None:
            return f"while setting up the training run in {self.out_dir} (no step was run)"
        done = self.run.state.step
        total = total_steps(self.run.config, len(self.run.stream.records))
        latest = latest_checkpoint(self.out_dir / "checkpoints")
        saved = f"last complete checkpoint: {latest}" if latest else "no checkpoint saved yet"
        where = (f"after the last step ({total} of {total})" if done >= total
                 else f"in step {done + 1} of {total}")
        return f"{where} of the training run in {self.out_dir}; {saved}"

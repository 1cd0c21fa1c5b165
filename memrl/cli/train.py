"""`memrl train CONFIG.yaml [key.path=value ...] [--resume]`."""

from __future__ import annotations

import os
from pathlib import Path

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
    """Train a memory agent with GRPO-family RL."""
    from rich.console import Console

    from memrl.config import load_config
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
    console = Console()
    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        console.print(f"training → {cfg.trainer.out_dir}")
    try:
        state = grpo.train(cfg, console=console)
    finally:
        destroy_process_group()
    if not main_rank:
        return
    console.print(
        f"done: {state.step} steps; metrics {Path(cfg.trainer.out_dir) / 'metrics.jsonl'}, "
        f"plot {Path(cfg.trainer.out_dir) / 'training.png'}"
    )

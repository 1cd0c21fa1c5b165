"""`memrl train CONFIG.yaml [key.path=value ...] [--resume]`."""

from __future__ import annotations

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
) -> None:
    """Train a memory agent with GRPO-family RL."""
    from rich.console import Console

    from memrl.config import load_config
    from memrl.recipes import grpo
    from memrl.recipes.config import TrainConfig

    extra = list(overrides or [])
    if resume:
        extra.append("trainer.resume=auto")
    cfg = load_config(TrainConfig, config, extra)
    console = Console()
    console.print(f"training → {cfg.trainer.out_dir}")
    state = grpo.train(cfg, console=console)
    console.print(
        f"done: {state.step} steps; metrics {Path(cfg.trainer.out_dir) / 'metrics.jsonl'}, "
        f"plot {Path(cfg.trainer.out_dir) / 'training.png'}"
    )

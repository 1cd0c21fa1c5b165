"""`memrl sft CONFIG.yaml [key.path=value ...] [--resume]`: warm start on teacher trajectories."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.cli.app import app
from memrl.cli.train import ConfigArgument, OverridesArgument, ResumeOption, load_run_config

MinScoreOption = Annotated[float | None, typer.Option(
    "--min-score", help="Keep trajectories-file lines scoring at least this (data.min_score).")]


@app.command("sft")
def sft(
    config: ConfigArgument,
    overrides: OverridesArgument = None,
    resume: ResumeOption = False,
    min_score: MinScoreOption = None,
) -> None:
    """Supervised fine-tuning on oracle trajectories or a filtered trajectories file.

    Ctrl-C or SIGTERM stops the run with one line and the command that continues it from
    its last checkpoint; exit code 130 / 143.
    """
    from rich.console import Console

    from memrl.recipes.launch import record_training, resume_command
    from memrl.fileio import check_output_dir
    from memrl.interrupt import exit_on_signals
    from memrl.recipes import sft as recipe
    from memrl.recipes.sft_config import SFTConfig

    given = [*(overrides or []), *([f"data.min_score={min_score}"] if min_score is not None
                                   else [])]
    cfg = load_run_config(SFTConfig, config, given, resume)
    console = Console()
    source = cfg.data.trajectories or f"the oracle on {cfg.data.train_file}"
    console.print(f"warm start from {source} → {cfg.trainer.out_dir}")
    out_dir = Path(cfg.trainer.out_dir)
    check_output_dir(out_dir, location=f"trainer.out_dir {out_dir}")
    how = "continue with: " + resume_command(config, given, "sft")
    with record_training("sft", cfg, None), \
            exit_on_signals(f"during the warm start in {out_dir}", how):
        if cfg.trainer.launcher == "ray":
            from memrl.distributed import train_on_ray

            state = train_on_ray(cfg, sft_rank)
        else:
            state = recipe.train(cfg, console=console)
    console.print(
        f"done: {state.step} steps; metrics {out_dir / 'metrics.jsonl'}"
    )


def sft_rank(cfg: Any) -> Any:
    """One rank of a `trainer.launcher: ray` run: the recipe, printing on the main rank."""
    from rich.console import Console

    from memrl.recipes import sft as recipe

    return recipe.train(cfg, console=Console())

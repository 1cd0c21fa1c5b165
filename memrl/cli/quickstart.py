"""`memrl quickstart`: a tiny model learns the real task on a CPU, offline, in minutes."""

from __future__ import annotations

from pathlib import Path

import typer

from memrl.cli.app import app


@app.command("quickstart")
def quickstart(
    config: Path = typer.Option(Path("configs/quickstart.yaml"), help="GRPO config."),
    sft_config: Path = typer.Option(
        Path("configs/quickstart_sft.yaml"), "--sft-config", help="Warm-start config."
    ),
    overrides: list[str] = typer.Argument(
        None, help="Dotted overrides of the GRPO config, e.g. trainer.total_steps=5"
    ),
    fresh: bool = typer.Option(
        False, "--fresh",
        help="Start over: delete a previous quickstart run and what it built (model, data) "
             "inside its directory. Without it, an interrupted quickstart continues where it "
             "stopped."),
    threads: int | None = typer.Option(
        None, "--threads", min=0,
        help="torch CPU threads (0: torch's default, one per core); default: "
             "QuickstartPlan.threads, 1, which suits the tiny model on a shared CPU."),
) -> None:
    """Tiny model → evaluation → warm start on oracle trajectories → evaluation → GRPO with
    the answer reward → evaluation; prints and plots accuracy against document count."""
    from memrl.apps.quickstart import QuickstartPlan, run_quickstart

    run_quickstart(config, list(overrides or []), sft_config_path=sft_config, fresh=fresh,
                   plan=QuickstartPlan() if threads is None else QuickstartPlan(
                       threads=threads or None))

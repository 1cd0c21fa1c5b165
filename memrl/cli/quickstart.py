"""`memrl quickstart`: the whole pipeline on a tiny model, offline, in a minute or two."""

from __future__ import annotations

from pathlib import Path

import typer

from memrl.cli.app import app


@app.command("quickstart")
def quickstart(
    config: Path = typer.Option(Path("configs/quickstart.yaml"), help="Quickstart config."),
    overrides: list[str] = typer.Argument(
        None, help="Dotted overrides, e.g. trainer.total_steps=5"
    ),
    fresh: bool = typer.Option(False, "--fresh", help="Delete a previous quickstart run first."),
) -> None:
    """Build a tiny model and synthetic data, evaluate, train with GRPO, evaluate again."""
    from memrl.quickstart import run_quickstart

    run_quickstart(config, list(overrides or []), fresh=fresh)

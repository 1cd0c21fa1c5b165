"""`memrl view RUN_DIR [--out FILE] [steps=[...]]`: one self-contained HTML page of the run's
episodes."""

from __future__ import annotations

from pathlib import Path

import typer

from memrl.cli.app import app
from memrl.command_config import ViewConfig
from memrl.config import load_command_config


@app.command("view")
def view(
    run_dir: Path = typer.Argument(..., help="A run or evaluation directory (searched deeply), "
                                   "or one trajectories JSONL file (memrl ask ask.trace=FILE)."),
    args: list[str] = typer.Argument(
        None, show_default=False,
        help="key=value settings: steps=[N,...], the training steps whose trajectory "
             "records to list (default: the last 50 logged)."),
    out: Path = typer.Option(None, "--out", help="Where to write the page (RUN_DIR/view.html, "
                             "FILE.html for a file)."),
) -> None:
    """The runs' records (how each ran, its exit status), training runs' trajectories step
    by step, chunk-by-chunk memories (added / dropped words, gold answer marked), tool calls
    and store changes, final answers and scores, with filters: one HTML file, no server."""
    from memrl.apps.view import write_view

    cfg = load_command_config(ViewConfig, args)
    path = write_view(run_dir, out, steps=cfg.steps or None)
    typer.echo(f"wrote {path}")

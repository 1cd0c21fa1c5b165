"""`memrl view RUN_DIR [--out FILE]`: one self-contained HTML page of the run's episodes."""

from __future__ import annotations

from pathlib import Path

import typer

from memrl.cli.app import app


@app.command("view")
def view(
    run_dir: Path = typer.Argument(..., help="A run or evaluation directory (searched deeply), "
                                   "or one trajectories JSONL file (memrl ask --trace)."),
    out: Path = typer.Option(None, "--out", help="Where to write the page (RUN_DIR/view.html, "
                             "FILE.html for a file)."),
    step: list[int] = typer.Option(
        None, "--step", help="Training step whose trajectory records to list (repeat for "
        "several; default: the last 50 logged)."),
) -> None:
    """The runs' records (how each ran, its exit status), training runs' trajectories step
    by step, chunk-by-chunk memories (added / dropped words, gold answer marked), tool calls
    and store changes, final answers and scores, with filters: one HTML file, no server."""
    from memrl.apps.view import write_view

    path = write_view(run_dir, out, steps=step or None)
    typer.echo(f"wrote {path}")

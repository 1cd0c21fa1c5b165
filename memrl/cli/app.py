"""The typer applications that command modules attach to. Kept apart to avoid import cycles."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="memrl",
    help="Train and evaluate LLM memory agents with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
prepare_app = typer.Typer(help="Convert datasets into memrl's formats.", no_args_is_help=True)
app.add_typer(prepare_app, name="prepare")

"""`memrl quickstart [CONFIG] [key=value ...] [--fresh]`: a tiny model learns the real task on a
CPU, offline, in minutes."""

from __future__ import annotations

from pathlib import Path

import typer

from memrl.cli.app import app
from memrl.command_config import QuickstartCommand, QuickstartSettings
from memrl.config import load_config, split_config_args

OWN_PREFIX = "quickstart."
"""Keys of the quickstart itself (`quickstart.threads=2`); every other key is the GRPO
config's."""


def split_quickstart_args(args: list[str] | None) -> tuple[Path, list[str], QuickstartSettings]:
    """(the GRPO config file, its overrides, the quickstart's own settings) of
    `[CONFIG] [key=value ...]`; CONFIG defaults to configs/quickstart.yaml."""
    config, overrides = split_config_args(args)
    own = [o for o in overrides if o.startswith(OWN_PREFIX)]
    settings = load_config(QuickstartCommand, None, own).quickstart
    rest = [o for o in overrides if not o.startswith(OWN_PREFIX)]
    return config or Path("configs/quickstart.yaml"), rest, settings


@app.command("quickstart")
def quickstart(
    args: list[str] = typer.Argument(
        None, show_default=False,
        help="CONFIG then key=value overrides: the GRPO config (default "
             "configs/quickstart.yaml) and its dotted overrides, e.g. trainer.total_steps=5; "
             "quickstart.sft_config=FILE (the warm start's config) and quickstart.threads=N "
             "(torch CPU threads, 0: one per core; default 1) are the quickstart's own."),
    fresh: bool = typer.Option(
        False, "--fresh",
        help="Start over: delete a previous quickstart run and what it built (model, data) "
             "inside its directory. Without it, an interrupted quickstart continues where it "
             "stopped (the quickstart's --resume, the other way round)."),
) -> None:
    """Tiny model → evaluation → warm start on oracle trajectories → evaluation → GRPO with
    the answer reward → evaluation; prints and plots accuracy against document count."""
    from memrl.apps.quickstart import QuickstartPlan, run_quickstart

    config, overrides, settings = split_quickstart_args(args)
    run_quickstart(config, overrides, sft_config_path=settings.sft_config, fresh=fresh,
                   plan=QuickstartPlan() if settings.threads is None else QuickstartPlan(
                       threads=settings.threads or None))

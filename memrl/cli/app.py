"""The typer applications that command modules attach to. Kept apart to avoid import cycles."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

CONFIG_COMMAND = "config"
"""The `memrl eval` command that reads an evaluation config: `memrl eval CONFIG [k=v ...]`
is `memrl eval config CONFIG [k=v ...]`."""


class ConfigOrCommandGroup(TyperGroup):
    """A group whose first argument is a command name or a config file: `memrl eval
    CONFIG ...` runs the group's CONFIG_COMMAND on it. A config file is a path that exists,
    ends in .yaml / .yml or names a directory; any other word stays a command name (an
    unknown one is a usage error naming it)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and is_config_path(args[0]):
            args = [CONFIG_COMMAND, *args]
        return super().parse_args(ctx, args)


def is_config_path(arg: str) -> bool:
    """`arg` names a config file rather than a command (see ConfigOrCommandGroup)."""
    import os

    return not arg.startswith("-") and (
        arg.endswith((".yaml", ".yml")) or os.sep in arg or os.path.exists(arg))


app = typer.Typer(
    name="memrl",
    help="Train and evaluate LLM memory agents with reinforcement learning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
prepare_app = typer.Typer(help="Convert datasets into memrl's formats.", no_args_is_help=True)
eval_app = typer.Typer(
    cls=ConfigOrCommandGroup, no_args_is_help=True,
    help="Evaluate a model with a memory agent. `memrl eval CONFIG.yaml key.path=value ... "
    "--resume` runs an evaluation config: agent, model, rollout.* engine, eval.benchmarks "
    "(docs/configuration.md); the commands below are the older per-benchmark forms.")
app.add_typer(prepare_app, name="prepare")
app.add_typer(eval_app, name="eval")

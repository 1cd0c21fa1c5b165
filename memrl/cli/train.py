"""`memrl train CONFIG.yaml [key.path=value ...] [--resume]`: the config read, torchrun
started for --nproc-per-node, then the library's run (`memrl.recipes.launch.train`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from memrl.cli.app import app

T = TypeVar("T")

ConfigArgument = Annotated[Path, typer.Argument(
    help="The run's config (YAML; its keys: docs/configuration.md).")]
OverridesArgument = Annotated[list[str] | None, typer.Argument(
    help="Dotted overrides, e.g. rollout.n=8 memagent.chunk_size=512 (YAML values).")]
ResumeOption = Annotated[bool, typer.Option(
    "--resume", help="Continue from the latest checkpoint (trainer.resume=auto).")]
NprocOption = Annotated[int, typer.Option(
    "--nproc-per-node", min=1, help="Train on N processes of this machine (data parallel; one "
    "GPU each on CUDA): memrl starts `torchrun --standalone --nproc-per-node N` on itself.")]


def load_run_config(model: type[T], config: Path, overrides: list[str], resume: bool) -> T:
    """`CONFIG [key.path=value ...] [--resume]` of `memrl train` / `memrl sft` as a validated
    `model` (--resume is trainer.resume=auto)."""
    from memrl.config import load_config
    from memrl.errors import MemrlInputError

    if "=" in str(config) and not config.exists():  # `memrl train model.path=...`
        raise MemrlInputError("a run starts from a config file, then its overrides: CONFIG "
                              "[key.path=value ...] (e.g. configs/quickstart.yaml)",
                              location=str(config))
    return load_config(model, config, [*overrides, *(["trainer.resume=auto"] if resume
                                                     else [])])


@app.command("train")
def train(
    config: ConfigArgument,
    overrides: OverridesArgument = None,
    resume: ResumeOption = False,
    nproc_per_node: NprocOption = 1,
) -> None:
    """Train a memory agent with GRPO-family RL.

    Ctrl-C or SIGTERM stops the run with one line saying at which step it stopped, its last
    complete checkpoint and the command that continues from it; exit code 130 / 143. A failure
    of the machinery (every rollout server lost, a rollout engine off the policy) is one line
    with the same, exit code 1.
    """
    from rich.console import Console

    from memrl.distributed import launched, relaunch
    from memrl.recipes import launch
    from memrl.recipes.config import TrainConfig

    cfg = load_run_config(TrainConfig, config, list(overrides or []), resume)
    launch.check_launcher(cfg.trainer.launcher == "ray", nproc_per_node)
    if nproc_per_node > 1 and not launched():
        raise typer.Exit(
            relaunch(nproc_per_node, ["train", str(config), *(overrides or []),
                                      *(["--resume"] if resume else [])])
        )
    console = Console()
    how = "continue with: " + launch.resume_command(config, list(overrides or []))
    state = launch.train(cfg, how_to_continue=how, console=console)
    if os.environ.get("RANK", "0") != "0":
        return
    out_dir = Path(cfg.trainer.out_dir)
    console.print(
        f"done: {state.step} steps; metrics {out_dir / 'metrics.jsonl'}, "
        f"plot {out_dir / 'training.png'}"
    )

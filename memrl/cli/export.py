"""`memrl export CHECKPOINT OUT_DIR [model.path=BASE]`: a training checkpoint as a plain
Hugging Face model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memrl.cli.app import app
from memrl.command_config import ExportConfig
from memrl.config import load_command_config


@app.command("export")
def export(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="A checkpoint dir (step_*), a checkpoints root, or a training run dir "
            "(the latest checkpoint is taken)."
        ),
    ],
    out_dir: Annotated[Path, typer.Argument(help="New directory for the exported model.")],
    args: Annotated[list[str] | None, typer.Argument(
        show_default=False,
        help="key=value settings: model.path=BASE, the base model of a LoRA checkpoint (default: "
             "model.path of its config.yaml).")] = None,
) -> None:
    """Write a model directory loadable by AutoModelForCausalLM (LoRA adapters merged)."""
    from memrl.cli.common import print_warning
    from memrl.fileio import check_output_dir
    from memrl.run.checkpoint import export_checkpoint, read_checkpoint_marker, resolve_checkpoint

    cfg = load_command_config(ExportConfig, args)
    check_output_dir(out_dir)
    ckpt = resolve_checkpoint(checkpoint, warn=print_warning)
    fmt = read_checkpoint_marker(ckpt)["format"]
    out = export_checkpoint(ckpt, out_dir, base_model_path=cfg.model.path)
    how = "LoRA merged into its base model" if fmt == "lora" else "full model"
    typer.echo(f"exported {ckpt} ({how}) to {out}")

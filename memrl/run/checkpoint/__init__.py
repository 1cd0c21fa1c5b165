"""Training checkpoints: atomic saves, resume into the live model, keep-last-K, HF export.

`layout` (the directory layout, finding the latest complete checkpoint), `save`, `load`,
`rng` (every generator's state) and `export` (a plain Hugging Face model directory).
"""

from __future__ import annotations

from memrl.run.checkpoint.export import export_checkpoint
from memrl.run.checkpoint.layout import (
    checkpoint_config,
    is_complete_checkpoint,
    latest_checkpoint,
    read_checkpoint_marker,
    resolve_checkpoint,
)
from memrl.run.checkpoint.load import load_checkpoint
from memrl.run.checkpoint.save import save_checkpoint

__all__ = [
    "checkpoint_config", "export_checkpoint", "is_complete_checkpoint",
    "latest_checkpoint", "load_checkpoint", "read_checkpoint_marker", "resolve_checkpoint",
    "save_checkpoint",
]

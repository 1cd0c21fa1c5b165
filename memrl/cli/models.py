"""`memrl init-tiny-model`: write a tiny random Qwen2 checkpoint for offline runs and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memrl.cli.app import app
from memrl.errors import MemrlInputError


@app.command("init-tiny-model")
def init_tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    hidden_size: Annotated[int, typer.Option(help="Width of the residual stream.")] = 128,
    num_layers: Annotated[int, typer.Option(help="Number of transformer blocks.")] = 2,
    num_heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    num_kv_heads: Annotated[int, typer.Option(help="Key/value heads (GQA).")] = 2,
    intermediate_size: Annotated[int, typer.Option(help="Width of the MLP.")] = 256,
    vocab_size: Annotated[
        int, typer.Option(help="Upper bound on the BPE vocabulary trained on the fly.")
    ] = 1024,
) -> None:
    """Build a random-weight Qwen2 model + BPE tokenizer (ChatML) loadable by AutoModel."""
    from memrl.models.tiny import MIN_VOCAB_SIZE, check_vocab_size

    try:
        check_vocab_size(vocab_size)
    except MemrlInputError as exc:
        raise MemrlInputError(
            f"must be at least {MIN_VOCAB_SIZE} (the 256 byte symbols and the special tokens "
            f"of a byte-level BPE), got {vocab_size}",
            location="--vocab-size",
        ) from exc
    if out_dir.exists() and not out_dir.is_dir():
        raise MemrlInputError("exists and is not a directory", location=str(out_dir))

    from transformers.utils import logging as hf_logging

    from memrl.models.tiny import build_tiny_model, count_parameters

    hf_logging.disable_progress_bar()
    try:
        path = build_tiny_model(
            out_dir,
            seed=seed,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            intermediate_size=intermediate_size,
            vocab_size=vocab_size,
        )
    except OSError as exc:  # no permission, disk full, a file where a directory should be
        where = exc.filename if exc.filename else out_dir
        reason = exc.strerror or str(exc).splitlines()[0]
        raise MemrlInputError(f"cannot write the model: {reason}", location=str(where)) \
            from None
    typer.echo(f"tiny model: {count_parameters(path):,} parameters, written to {path}")

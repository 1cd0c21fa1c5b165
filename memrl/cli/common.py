"""Pieces every evaluation command shares: checked inputs, config from options, a generator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from memrl.errors import MemrlInputError


def config_from_options(model: type[BaseModel], **fields: Any) -> Any:
    """Build an agent config from CLI values; a bad value is a one-line error naming its option."""
    try:
        return model(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        option = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "config"
        raise MemrlInputError(err["msg"], location=option) from exc


def check_model_dir(model: Path) -> None:
    """A local Hugging Face model directory, checked before anything heavy is loaded."""
    if not model.is_dir():
        raise MemrlInputError("model directory not found", location=f"--model {model}")
    if not (model / "config.json").is_file():
        raise MemrlInputError(
            "not a Hugging Face model directory (no config.json)", location=f"--model {model}"
        )


def load_generator(
    model: Path, *, device: str | None, dtype: str | None, batch_size: int, seed: int | None
) -> Any:
    """HFGenerator for `model` on `device` (validated), with torch seeded when asked."""
    import torch

    from memrl.inference.hf import HFGenerator
    from memrl.inference.loader import load_pretrained, resolve_device

    try:
        device = resolve_device(device)
    except MemrlInputError as exc:
        raise MemrlInputError(exc.message, location="--device") from None
    if seed is not None:
        torch.manual_seed(seed)
    model_, tokenizer = load_pretrained(str(model), device=device, dtype=dtype)
    generator = HFGenerator(model_, tokenizer, max_batch_size=batch_size)
    generator.name_or_path = str(model)
    return generator

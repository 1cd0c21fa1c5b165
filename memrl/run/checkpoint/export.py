"""A checkpoint as a plain Hugging Face model directory (`memrl export`): LoRA merged into its
base, a sharded model gathered whole."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from memrl import modelfiles
from memrl.errors import MemrlInputError, require
from memrl.fileio import check_output_dir
from memrl.run.checkpoint.layout import (
    CONFIG_FILE,
    MODEL_DIR,
    MODEL_MARKER,
    SHARDED_DIR,
    TOKENIZER_DIR,
    TRAINER_STATE,
    first_line,
    is_complete_checkpoint,
    read_checkpoint_marker,
)


def export_checkpoint(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    base_model_path: str | None = None,
) -> Path:
    """Write a plain Hugging Face model directory (weights + tokenizer) from a checkpoint,
    with the run's config beside them (`modelfiles.EXPORTED_CONFIG`).

    A LoRA checkpoint is merged into its base model: `base_model_path`, else the config's
    `model.path`, else the base recorded by peft. A sharded one is gathered whole on this
    process (its weights only, not the optimizer state). The result loads with
    `AutoModelForCausalLM.from_pretrained` and needs neither memrl nor peft.
    """
    from transformers import AutoModelForCausalLM

    ckpt = Path(checkpoint_dir)
    out = Path(out_dir)
    if not is_complete_checkpoint(ckpt):
        raise MemrlInputError(
            f"not a complete checkpoint (needs {TRAINER_STATE} and {MODEL_DIR}/)",
            location=str(ckpt),
        )
    check_output_dir(out)
    if out.is_dir() and any(out.iterdir()):
        raise MemrlInputError("output directory exists and is not empty", location=str(out))
    marker = read_checkpoint_marker(ckpt)
    model_dir = ckpt / MODEL_DIR

    if marker["format"] == "full":
        modelfiles.check_model_dir(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        tokenizer_source: Path | str | None = None
    elif marker["format"] == "sharded":
        model = _gather_shards(ckpt, marker)
        tokenizer_source = None
    else:
        peft = require("peft", extra="lora", feature="exporting a LoRA checkpoint")
        modelfiles.check_adapter_dir(model_dir)
        base = base_model_path or _config_model_path(ckpt) or marker.get("base_model")
        if not base:
            raise MemrlInputError(
                "LoRA checkpoint without a base model: pass model.path=PATH",
                location=str(ckpt),
            )
        try:
            base_model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
        except OSError as exc:  # not a local model dir and not a (cached) hub id
            hint = "" if base_model_path else "; pass model.path=PATH"
            raise MemrlInputError(
                f"cannot load the base model {base!r} of this LoRA checkpoint "
                f"({str(exc).splitlines()[0]}){hint}",
                location=str(ckpt),
            ) from None
        model = peft.PeftModel.from_pretrained(base_model, model_dir).merge_and_unload()
        tokenizer_source = base

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if (ckpt / TOKENIZER_DIR).is_dir():
        for f in (ckpt / TOKENIZER_DIR).iterdir():
            if f.is_file():
                shutil.copy2(f, out / f.name)
    elif tokenizer_source is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(out)
    if (ckpt / CONFIG_FILE).is_file():
        shutil.copy2(ckpt / CONFIG_FILE, out / modelfiles.EXPORTED_CONFIG)
    return out


def _gather_shards(ckpt: Path, marker: dict[str, Any]) -> Any:
    """The whole model of a sharded checkpoint, built from its config, on this process."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, str(marker.get("dtype", "float32")), None)
    if not isinstance(dtype, torch.dtype):
        raise MemrlInputError(f"unknown dtype {marker.get('dtype')!r}",
                              location=str(ckpt / MODEL_DIR / MODEL_MARKER))
    try:
        config = AutoConfig.from_pretrained(ckpt / MODEL_DIR)
    except (OSError, ValueError) as exc:
        raise MemrlInputError(f"cannot read the model's config: {first_line(exc)}",
                              location=str(ckpt / MODEL_DIR)) from None
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {"model": model.state_dict()}
    try:  # only the weights are read: the optimizer's entries stay on disk
        with warnings.catch_warnings():  # "assuming ... a single process": yes, on purpose
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=ckpt / SHARDED_DIR, no_dist=True)
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        raise MemrlInputError(f"cannot read the sharded weights: {first_line(exc)}",
                              location=str(ckpt / SHARDED_DIR)) from None
    model.load_state_dict(state["model"])
    return model


def _config_model_path(ckpt: Path) -> str | None:
    """`model.path` from the checkpoint's config.yaml, if present."""
    import yaml

    file = ckpt / CONFIG_FILE
    if not file.is_file():
        return None
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise MemrlInputError(f"invalid YAML: {exc}", location=str(file)) from None
    model = data.get("model") if isinstance(data, dict) else None
    path = model.get("path") if isinstance(model, dict) else None
    return str(path) if path else None

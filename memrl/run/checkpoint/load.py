"""Loading a checkpoint into the live model, optimizer, scheduler and RNGs (a resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memrl.distributed import Dist
from memrl.errors import MemrlInputError, require
from memrl.rl.trainer.sharding import is_sharded
from memrl.run.checkpoint.critic import load_critic
from memrl.run.checkpoint.layout import (
    MODEL_DIR,
    OPTIMIZER_FILE,
    RANK_RNG_DIR,
    RNG_FILE,
    SCHEDULER_FILE,
    SHARDED_DIR,
    TRAINER_STATE,
    is_peft,
    read_checkpoint_marker,
    read_json,
    unwrap,
)
from memrl.run.checkpoint.rng import set_rng_state
from memrl.run.checkpoint.shards import read_shards


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    dist: Dist = Dist(),
    critic: Any | None = None,
) -> dict[str, Any]:
    """Load a checkpoint into live objects and return its trainer state.

    Weights are copied into the existing parameters (never replaced), so an optimizer built
    over them stays valid. Then optimizer, scheduler and RNG states are restored. A sharded
    checkpoint is read by every rank at once (a collective), on any number of ranks, into
    a sharded or a replicated model; each rank takes its own RNG state (rank 0's if it has
    none). `critic` (PPO): its model, optimizer and scheduler from `critic/`.
    """
    path = Path(path)
    if not path.is_dir():
        raise MemrlInputError("checkpoint directory not found", location=str(path))
    state = _read_trainer_state(path)
    rng_file = path / RNG_FILE
    if not (path / MODEL_DIR).is_dir():
        raise MemrlInputError(f"checkpoint is missing {MODEL_DIR}/", location=str(path / MODEL_DIR))
    if read_checkpoint_marker(path)["format"] == "sharded":
        read_shards(path / SHARDED_DIR, unwrap(model), optimizer)
        rng_file = path / RANK_RNG_DIR / f"rank_{dist.rank:05d}.pt"
        if not rng_file.is_file():
            rng_file = path / RANK_RNG_DIR / f"rank_{0:05d}.pt"
    else:
        if is_sharded(model):
            raise MemrlInputError(
                "this checkpoint holds a whole (replicated) model, and model.strategy is "
                "fsdp: resume it with model.strategy=replicate, or export it and start the "
                "fsdp run from the exported model (model.path)",
                location=str(path),
            )
        _load_model(path / MODEL_DIR, unwrap(model))
        if optimizer is not None:
            optimizer.load_state_dict(_torch_load(path / OPTIMIZER_FILE))
    if scheduler is not None:
        scheduler.load_state_dict(_torch_load(path / SCHEDULER_FILE))
    if critic is not None:
        load_critic(path, critic)
    set_rng_state(_torch_load(rng_file))
    return state


def _read_trainer_state(path: Path) -> dict[str, Any]:
    state = read_json(path / TRAINER_STATE)
    if "step" not in state:
        raise MemrlInputError("missing key 'step'", location=str(path / TRAINER_STATE))
    return state


def _torch_load(file: Path) -> Any:
    if not file.is_file():
        raise MemrlInputError(f"checkpoint is missing {file.name}", location=str(file))
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise MemrlInputError(f"corrupt checkpoint file: {exc}", location=str(file)) from None


def _load_model(model_dir: Path, model: torch.nn.Module) -> None:
    if not model_dir.is_dir():
        raise MemrlInputError(f"checkpoint is missing {MODEL_DIR}/", location=str(model_dir))
    fmt = read_checkpoint_marker(model_dir.parent)["format"]
    live = "lora" if is_peft(model) else "full"
    if fmt == "sharded":
        raise MemrlInputError("a sharded checkpoint has no HF weights here: use "
                              "load_checkpoint or memrl export", location=str(model_dir))
    if fmt != live:
        names = {"lora": "a LoRA adapter (peft)", "full": "a full model"}
        raise MemrlInputError(
            f"checkpoint holds {names[fmt]} but the live model is {names[live]}",
            location=str(model_dir),
        )
    if fmt == "lora":
        _load_adapters(model_dir, model)
    else:
        _load_full(model_dir, model)


def _read_safetensors(model_dir: Path, stem: str) -> dict[str, torch.Tensor]:
    """All tensors of `stem.safetensors`, or of the shards its `.index.json` lists."""
    from safetensors.torch import load_file

    index = model_dir / f"{stem}.safetensors.index.json"
    if index.is_file():
        files = sorted(set(read_json(index).get("weight_map", {}).values()))
    else:
        files = [f"{stem}.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        file = model_dir / name
        if not file.is_file():
            raise MemrlInputError(f"checkpoint is missing {name}", location=str(file))
        try:
            tensors.update(load_file(file, device="cpu"))
        except Exception as exc:  # safetensors raises its own error type for bad headers
            raise MemrlInputError(f"corrupt weights file: {exc}", location=str(file)) from None
    return tensors


def _load_full(model_dir: Path, model: torch.nn.Module) -> None:
    tensors = _read_safetensors(model_dir, "model")
    live = model.state_dict()
    unexpected = sorted(set(tensors) - set(live))
    if unexpected:
        raise MemrlInputError(
            f"checkpoint weights do not match the model: unexpected {unexpected[:5]}",
            location=str(model_dir),
        )
    # save_pretrained writes a tied weight once; a missing key is fine only if its live
    # tensor is shared with a key that was loaded.
    loaded_ptrs = {live[k].data_ptr() for k in tensors}
    missing = [k for k in live if k not in tensors and live[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise MemrlInputError(
            f"checkpoint weights do not match the model: missing {missing[:5]}",
            location=str(model_dir),
        )
    try:
        model.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:  # shape mismatches
        first = str(exc).strip().splitlines()[-1].strip()
        raise MemrlInputError(
            f"checkpoint weights do not match the model: {first}", location=str(model_dir)
        ) from None


def _load_adapters(model_dir: Path, model: Any) -> None:
    """Copy each adapter's saved LoRA weights into the live peft model (same keys or error)."""
    peft_utils = require("peft", extra="lora", feature="loading a LoRA checkpoint")
    for name in model.peft_config:
        adapter_dir = model_dir if name == "default" else model_dir / name
        saved = _read_safetensors(adapter_dir, "adapter_model")
        expected = peft_utils.get_peft_model_state_dict(model, adapter_name=name)
        if set(saved) != set(expected):
            diff = sorted(set(saved) ^ set(expected))
            raise MemrlInputError(
                f"adapter {name!r} does not match the model's LoRA layers: {diff[:5]}",
                location=str(adapter_dir),
            )
        result = peft_utils.set_peft_model_state_dict(model, saved, adapter_name=name)
        if result.unexpected_keys:
            raise MemrlInputError(
                f"adapter {name!r} was not applied: {result.unexpected_keys[:5]}",
                location=str(adapter_dir),
            )

"""A model's (and its optimizer's) state sharded by every rank with torch.distributed.checkpoint
(DCP): the policy's `sharded/` and a sharded critic's `critic/sharded/`.

    write_shards(out, model, optimizer)   every rank writes its shards (a collective)
    read_shards(out, model, optimizer)    every rank reads its part, resharded to this world,
                                          into a sharded or a replicated model
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from memrl.errors import MemrlInputError
from memrl.run.checkpoint.layout import first_line

__all__ = ["read_shards", "write_shards"]


def write_shards(out: Path, model: torch.nn.Module, optimizer: Any) -> None:
    """This rank's shards of the weights and of the optimizer state (a DCP collective):
    {"model": weights, "optim": AdamW state}, by parameter name."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        weights, optim = get_state_dict(model, optimizer)
        state = {"model": weights, "optim": optim}
    dcp.save(state, checkpoint_id=out)


def read_shards(shards: Path, model: torch.nn.Module, optimizer: Any, *,
                what: str = "model") -> None:
    """Weights (and the optimizer state) from a DCP checkpoint, resharded to this world.
    `what` names the model in the error of a checkpoint that does not fit it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if not shards.is_dir():
        raise MemrlInputError(f"checkpoint is missing {shards.name}/", location=str(shards))
    try:
        if optimizer is None:
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=shards)
            set_model_state_dict(model, state["model"])
        else:
            weights, optim = get_state_dict(model, optimizer)
            state = {"model": weights, "optim": optim}
            dcp.load(state, checkpoint_id=shards)
            set_state_dict(model, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
    except (RuntimeError, ValueError, KeyError, OSError) as exc:  # DCP's CheckpointException
        raise MemrlInputError(
            f"cannot load the sharded checkpoint into the {what}: {first_line(exc)}",
            location=str(shards),
        ) from None

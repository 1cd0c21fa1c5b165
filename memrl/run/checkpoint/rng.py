"""Every random generator's state (Python, numpy, torch CPU and CUDA), to save and restore."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def get_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and every CUDA generator, in a form `torch.load` can read
    with `weights_only=True` (numpy's key array is stored as a tensor)."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_rng_state` captured; CUDA states for as many devices as both have."""
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        for i in range(min(len(cuda), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda[i], device=i)


def _as_tuple(x: Any) -> Any:
    # random.setstate needs tuples all the way down; be lenient if a list came back.
    if isinstance(x, list | tuple):
        return tuple(_as_tuple(v) for v in x)
    return x

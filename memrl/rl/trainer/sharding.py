"""FSDP2: the policy, the reference and PPO's critic sharded over the training processes.

    model = shard(model, device, param_dtype=torch.bfloat16, cpu_offload=False)
        fully_shard(layer) for every decoder layer, then fully_shard(model): each rank keeps
        1/N of every weight (fp32 master), gathers a layer just before it runs, frees it
        after; gradients are reduce-scattered in fp32 and SUMMED over ranks (not averaged),
        because every rank's loss is already its exact share of the global loss
        (`LossNorm.with_global_count`), as with `Dist.sum_gradients` when replicated.

Every forward of a sharded module is a collective (its all-gathers), so the ranks must run
the same number of forward and backward passes: `memrl.rl.trainer.actor` pads a rank's micro-batches
to the largest count (`Dist.all_reduce_max`) with zero-weight ones. Generation is not done
with the sharded module (ranks generate different numbers of tokens: a deadlock); the
rollout engine holds a full copy, refreshed tensor by tensor every step
(`HFEngine.sync_weights`).

`run_as_forward(model, fn, ...)` runs `fn` inside the root module's forward hooks, so code
that calls the decoder and the output head separately (the fused log-prob path) sees the
root's own weights (embeddings, final norm, head) gathered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["decoder_layers", "is_sharded", "padding_micro_batch", "padding_passes",
           "run_as_forward", "shard"]

_FORWARD_METHOD = "memrl_run_as_forward"


def is_sharded(model: Any) -> bool:
    """Whether `model` is an FSDP2 module (its parameters are DTensor shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class Hugging Face marks as never to be
    split across devices (`_no_split_modules`, e.g. Qwen2DecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layer class (_no_split_modules): "
            "FSDP needs one unit per layer"
        )
    return layers


def shard(
    model: torch.nn.Module,
    device: torch.device | str,
    *,
    param_dtype: torch.dtype | None = None,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
) -> torch.nn.Module:
    """Shard `model` (in place; loaded on the CPU, each unit is moved to `device` as it is
    sharded) over the default process group; returns it.

    `device` is the compute device (cuda: this rank's GPU; cpu: gloo). `param_dtype`: the
    dtype of gathered weights for forward and backward (bf16 mixed precision; None keeps
    the stored dtype); gradients are reduced in fp32. `cpu_offload`: the shards, their
    gradients and the optimizer state stay in CPU memory.
    """
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    device = torch.device(device)
    mesh = init_device_mesh(device.type, (tdist.get_world_size(),))
    options: dict[str, Any] = dict(
        mesh=mesh,
        mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
        offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda")
        if cpu_offload else OffloadPolicy(),
    )
    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **options)
    fully_shard(model, **options)  # the rest: embeddings, final norm, head
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # Sum, not mean, over ranks: with factor 1 and plain SUM collectives (gloo has
            # no pre-multiplied sum), the reduce-scatter adds the ranks' gradients exactly.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    setattr(model, _FORWARD_METHOD, _call.__get__(model, type(model)))
    register_fsdp_forward_method(model, _FORWARD_METHOD)
    return model


def _call(self: Any, call: Callable[[], Any]) -> Any:
    return call()


def run_as_forward(model: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, inside `model`'s root forward hooks when it is sharded (its
    root weights gathered before, its gradients reduced after the backward).

    The root forward gets the call as one closure, no tensor: on a GPU, FSDP2's root
    pre-forward copies every tensor among its arguments to the device, blocking (one host
    wait per tensor, 11 per micro-batch of the update measured on an H100), and the caller's
    masks, meant to stay on the host, would then be indexed on the GPU."""
    method = getattr(model, _FORWARD_METHOD, None)
    if method is None:
        return fn(*args, **kwargs)
    return method(functools.partial(fn, *args, **kwargs))


def padding_passes(sharded_over: Any, count: int) -> int:
    """How many zero-weight micro-batches a rank adds to its `count` real ones so that every
    rank of a sharded model runs as many forwards as the busiest (its forwards are
    collectives); 0 when `sharded_over` (the ranks' `Dist`) is None: not sharded."""
    if sharded_over is None:
        return 0
    return sharded_over.all_reduce_max(count) - count


def padding_micro_batch(pad_id: int) -> dict[str, torch.Tensor]:
    """A one-token micro-batch (collated form) whose only use is to take part in a sharded
    model's collectives: the forward of a rank with fewer real micro-batches."""
    one = torch.full((1, 1), pad_id, dtype=torch.long)
    return {"input_ids": one, "labels": one, "attention_mask": torch.ones_like(one),
            "position_ids": torch.zeros_like(one),
            "response_mask": torch.ones((1, 1), dtype=torch.bool)}

"""`model.attn_implementation: varlen`: packed rows through PyTorch's variable-length flash
attention (`torch.nn.attention.varlen.varlen_attn`), everything else as sdpa.

A packed micro-batch (`memrl.rl.trainer.packing`, rl.remove_padding) is one row of several
samples. transformers attends within each sample by a mask it builds from the row's
position_ids: a dense (T, T) boolean mask for sdpa (which then cannot use its flash kernel),
a BlockMask for flex_attention; either way the host first waits for the GPU to find where
the samples start. With this implementation the caller gives the samples' boundaries as
transformers' flash-attention keywords (`cu_seq_lens_q/k`, `max_length_q/k`, computed on
the host from the collated batch: `memrl.rl.trainer.packing.varlen_kwargs`) and a mapping of no
masks in place of the attention mask, and each layer runs the flash kernel over the packed
row: no mask, no wait, no padding.

Without those keywords (generation, padded rows, a single sample) the implementation is
sdpa, with sdpa's masks: a model loaded with it behaves as sdpa wherever memrl does not pack.
On a CPU (no flash kernel) packed rows run sdpa sample by sample: the same values, slower.

The registered name in transformers is ``memrl_varlen``; `register()` adds it (idempotent)
before a model is loaded with it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["VARLEN_NAME", "packed_forward", "packed_masks", "register", "uses_varlen",
           "varlen_attention", "varlen_available"]

VARLEN_NAME = "memrl_varlen"
"""The attention implementation's name in transformers' registries."""


def varlen_available() -> bool:
    """Whether this torch and transformers can run it (torch's varlen module and
    transformers' attention registries)."""
    try:
        from transformers import AttentionInterface  # noqa: F401
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
    except ImportError:
        return False
    return _import_varlen()


def register() -> str:
    """Register `varlen_attention` (and sdpa's mask builder for its unpacked calls) with
    transformers under VARLEN_NAME; returns the name. One-line error without the API."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as exc:
        raise RuntimeError(
            "model.attn_implementation varlen needs transformers' attention registry "
            f"(transformers >= 4.54): {exc}") from None
    if not _import_varlen():
        raise RuntimeError(
            "model.attn_implementation varlen needs torch.nn.attention.varlen (torch >= 2.9); "
            f"this torch is {torch.__version__}")
    global _SDPA_MASK
    _varlen_api()
    _sdpa()
    _SDPA_MASK = sdpa_mask
    AttentionInterface.register(VARLEN_NAME, varlen_attention)
    AttentionMaskInterface.register(VARLEN_NAME, _mask)
    return VARLEN_NAME


_PACKED: contextvars.ContextVar[bool] = contextvars.ContextVar("memrl_varlen_packed",
                                                               default=False)
_SDPA_MASK: Any = None


def _mask(*args: Any, **kwargs: Any) -> Any:
    """The mask builder registered with the attention: none inside `packed_forward` (the
    attention takes the samples' bounds), sdpa's everywhere else."""
    return None if _PACKED.get() else _SDPA_MASK(*args, **kwargs)


@contextlib.contextmanager
def packed_forward(active: bool = True) -> Iterator[None]:
    """Around a packed forward that passes the samples' bounds: transformers builds no
    mask for a model of this attention (for a model whose forward takes no mapping of
    masks, `packed_masks` gives None and the masks come from `_mask`). `active` False:
    nothing changes (a forward of any other kind)."""
    if not active:
        yield
        return
    token = _PACKED.set(True)
    try:
        yield
    finally:
        _PACKED.reset(token)


_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def uses_varlen(model: Any) -> bool:
    """Whether `model` (or the decoder it wraps) attends with this implementation on
    packed rows: loaded with it, with only full and sliding-window attention layers, no
    logit soft-capping and no attention dropout (the kernel runs none of these; such a
    model keeps sdpa's masks)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != VARLEN_NAME:
        return False
    layer_types = set(getattr(config, "layer_types", None) or ())
    softcap = getattr(config, "attn_logit_softcapping", None)
    dropout = getattr(config, "attention_dropout", 0.0) or 0.0
    return layer_types <= _LAYER_TYPES and not softcap and not dropout


def packed_masks(model: Any) -> dict[str, None] | None:
    """The attention-mask argument of a packed varlen forward: where the model's forward
    takes a mapping of masks already built (Qwen2, Qwen3, ... in transformers 5), one of no
    mask per layer type, so transformers builds none and does not look for packed samples
    in the position_ids (which waits for the GPU); else None (Llama, Mistral, ...: their
    masks come from `_mask`, none inside `packed_forward`, after that one wait)."""
    if not _takes_mask_mapping(type(_decoder(model))):
        return None
    config = getattr(model, "config", None)
    kinds = set(getattr(config, "layer_types", None) or ()) | {"full_attention"}
    return dict.fromkeys(sorted(kinds))


_MAPPING_CHECK = "isinstance(causal_mask_mapping := attention_mask, dict)"
"""The line of transformers' decoders that takes a mapping as masks already built."""


def _decoder(model: Any) -> Any:
    """The module whose forward builds the masks (a causal LM's decoder; peft forwards)."""
    get = getattr(model, "get_decoder", None)
    try:
        return get() if callable(get) else model
    except (AttributeError, NotImplementedError):
        return model


@functools.cache
def _takes_mask_mapping(cls: type) -> bool:
    try:
        return _MAPPING_CHECK in inspect.getsource(cls.forward)
    except (OSError, TypeError, AttributeError):
        return False


def varlen_attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: Tensor | None = None,
    cu_seq_lens_k: Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query (1, Hq, T, D), key and value
    (1, Hkv, T, D); returns (1, T, Hq, D). Packed (the cu_seq_lens keywords given): causal
    attention within each sample; otherwise sdpa's."""
    if cu_seq_lens_q is None:
        return _sdpa()(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"varlen attention takes one packed row, got a batch of {query.shape[0]}")
    if dropout:
        raise ValueError(f"model.attn_implementation varlen runs without attention dropout "
                         f"(got {dropout})")
    cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    max_q = int(max_length_q) if max_length_q is not None else query.shape[2]
    max_k = int(max_length_k) if max_length_k is not None else max_q
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # (T, H, D)
    if q.is_cuda:
        # The kernel takes 16-bit inputs only and, unlike sdpa, is not cast by autocast
        # (under autocast the rotary embedding leaves q and k in float32).
        dtype = (torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda")
                 else q.dtype)
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"model.attn_implementation varlen runs in bfloat16 or float16 "
                             f"on a GPU (model.dtype auto or bfloat16), got {dtype}")
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        out = _flash(q, k, v, cu_seq_lens_q, cu_k, max_q, max_k, scale, sliding_window)
    else:
        out = _per_sample(q, k, v, cu_seq_lens_q, cu_k, scale, sliding_window)
    return out.unsqueeze(0), None


def _flash(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, max_q: int,
           max_k: int, scale: float, window: int | None = None) -> Tensor:
    """torch's varlen_attn, causal (within the last `window` keys if given), over whichever
    of its keywords this torch has (they changed between 2.9 and 2.13: is_causal or
    window_size, enable_gqa, scale)."""
    fn, params = _API or _varlen_api()
    kw: dict[str, Any] = {}
    if "window_size" in params:  # (left, right): (-1, 0) is causal
        kw["window_size"] = (-1 if window is None else window - 1, 0)
    elif window is None:
        kw["is_causal"] = True
    else:
        raise ValueError("sliding-window attention with model.attn_implementation varlen "
                         f"needs a torch whose varlen_attn takes window_size (this is "
                         f"{torch.__version__}): use sdpa")
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if "scale" in params:
        kw["scale"] = scale
    else:  # the kernel's own scale is 1/sqrt(D)
        q = q * (scale * math.sqrt(q.shape[-1]))
    return fn(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, **kw)


def _per_sample(q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor,
                scale: float, window: int | None = None) -> Tensor:
    """The same attention without a flash kernel: sdpa, causal (within the last `window`
    keys if given), one sample at a time."""
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    parts = []
    for i in range(len(bounds_q) - 1):
        qs = q[bounds_q[i]:bounds_q[i + 1]].transpose(0, 1)
        ks = k[bounds_k[i]:bounds_k[i + 1]].transpose(0, 1)
        vs = v[bounds_k[i]:bounds_k[i + 1]].transpose(0, 1)
        mask = None
        if window is not None:  # key j for query i: i - window < j <= i
            pos = torch.arange(qs.shape[1], device=q.device)
            gap = pos[:, None] - pos[None, :]
            mask = (gap >= 0) & (gap < window)
        out = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=scale,
            enable_gqa=ks.shape[0] != qs.shape[0])
        parts.append(out.transpose(0, 1))
    return torch.cat(parts) if parts else q.new_zeros(q.shape)


_API: tuple[Any, frozenset[str]] | None = None
_SDPA: Any = None


def _sdpa() -> Any:
    """transformers' sdpa attention function, imported once (by `register`: importing
    transformers' attention stack with memrl.rl would cost seconds to every CLI start)."""
    global _SDPA
    if _SDPA is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _SDPA = sdpa_attention_forward
    return _SDPA


def _varlen_api() -> tuple[Any, frozenset[str]]:
    """torch's varlen_attn and its keywords, looked up once (by `register`, before any
    compiled layer reads them: a plain global read keeps torch.compile's graph whole)."""
    global _API
    if _API is None:
        from torch.nn.attention.varlen import varlen_attn

        _API = varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)
    return _API


def _import_varlen() -> bool:
    try:
        import torch.nn.attention.varlen  # noqa: F401
    except ImportError:
        return False
    return True

"""Training FLOPs, model FLOPs utilisation (MFU) and padding waste of micro-batches.

Model FLOPs of one forward pass over sequences of lengths s_1..s_n (T = sum of s_i tokens),
with the vocabulary projected at R positions (the response tokens whose log-probs are
needed; the actor never projects the others):

    F_forward = 2·N·T  +  2·V·h·R  +  4·L·d·Σ s_i²
    F_train   = 3·F_forward  =  6·N·T + 6·V·h·R + 12·L·d·Σ s_i²

    N   parameters of the transformer body: every weight except the token embedding and
        the vocabulary projection (a weight is one multiply-add, 2 FLOPs, per token)
    V·h the vocabulary projection (vocab × hidden)
    L   layers;  d = attention heads × head dim (the query width)
    4·d·s² per layer and sequence: QKᵀ and attention × V, 2·s²·d each, over the full s × s
        score matrix (PaLM, arXiv:2204.02311 app. B; Megatron; verl's flops_counter), not
        the causal half a causal kernel computes. Σ s_i² is per sequence: packed samples
        do not attend to each other, and a padded row's padding is not model work.
    ×3  backward = 2 × forward (gradients of activations and of weights); recomputation
        under gradient checkpointing is hardware work, not model work, and is not counted.

MFU = F_train / (seconds × peak FLOP/s of the accelerator in the compute dtype).
Padding waste = padded tokens / tokens computed (the forward pass of a right-padded batch
computes rows × longest row; a packed one computes exactly T).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "PEAK_TFLOPS_16BIT",
    "ModelShape",
    "device_peak_flops",
    "forward_flops",
    "mfu",
    "padding_waste",
    "train_flops",
]


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs formula needs of a decoder-only transformer (see the module doc)."""

    body_params: int
    """N: parameters except the token embedding and the vocabulary projection."""
    head_params: int
    """V·h: parameters of the vocabulary projection."""
    layers: int
    """L."""
    attn_dim: int
    """d: attention heads × head dim."""

    @classmethod
    def of(cls, model: Any) -> ModelShape | None:
        """The shape of a Hugging Face causal LM (or a PEFT wrapper); None when its config
        does not say (no num_hidden_layers / num_attention_heads / hidden_size)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = getattr(base, "config", None)
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        layers = getattr(cfg, "num_hidden_layers", None)
        heads = getattr(cfg, "num_attention_heads", None)
        hidden = getattr(cfg, "hidden_size", None)
        if not (layers and heads and hidden):
            return None
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        embed = base.get_input_embeddings().weight
        head = base.get_output_embeddings()
        head_w = getattr(head, "weight", None)
        head_params = embed.numel() if head_w is None else head_w.numel()
        untied = head_w is not None and head_w is not embed
        total = sum(p.numel() for p in model.parameters())
        body = total - embed.numel() - (head_w.numel() if untied else 0)
        return cls(int(body), int(head_params), int(layers), int(heads * head_dim))


def forward_flops(seq_lens: Sequence[int], shape: ModelShape, *, logit_tokens: int) -> float:
    """F_forward of sequences of these lengths, the vocabulary projected at `logit_tokens`
    positions."""
    if any(s < 0 for s in seq_lens) or logit_tokens < 0:
        raise ValueError("sequence lengths and logit_tokens must be >= 0")
    tokens = sum(seq_lens)
    squares = sum(s * s for s in seq_lens)
    return float(
        2 * shape.body_params * tokens
        + 2 * shape.head_params * logit_tokens
        + 4 * shape.layers * shape.attn_dim * squares
    )


def train_flops(seq_lens: Sequence[int], shape: ModelShape, *, logit_tokens: int) -> float:
    """F_train = 3 · F_forward: one forward and one backward pass."""
    return 3.0 * forward_flops(seq_lens, shape, logit_tokens=logit_tokens)


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak."""
    if not seconds > 0 or not peak_flops_per_s > 0:
        raise ValueError(f"seconds ({seconds}) and peak ({peak_flops_per_s}) must be > 0")
    return flops / seconds / peak_flops_per_s


def padding_waste(real_tokens: int, computed_tokens: int) -> float:
    """Padded tokens / tokens computed (0 for a packed or empty micro-batch)."""
    if not 0 <= real_tokens <= computed_tokens:
        raise ValueError(f"need 0 <= real tokens ({real_tokens}) <= computed ({computed_tokens})")
    return (computed_tokens - real_tokens) / computed_tokens if computed_tokens else 0.0


PEAK_TFLOPS_16BIT = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
)
"""Dense (no sparsity) bf16/fp16 tensor-core peak, TFLOP/s, by a substring of
torch.cuda.get_device_name (first match; NVIDIA datasheets, SXM unless named)."""


def device_peak_flops(device: torch.device | str, dtype: torch.dtype | None) -> float | None:
    """Peak FLOP/s of a known CUDA device computing in bf16/fp16 (`dtype`, e.g. the autocast
    dtype), else None (CPU, fp32, an unlisted GPU)."""
    device = torch.device(device)
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS_16BIT:
        if key in name:
            return tflops * 1e12
    return None

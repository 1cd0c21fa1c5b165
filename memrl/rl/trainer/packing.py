"""Padding-free forward passes (verl `use_remove_padding`): a micro-batch as one packed row.

The samples of a right-padded `collate` batch are concatenated into a single row (batch size
1) with `position_ids` restarting at 0 for each sample and no attention mask:

    padded (B, L)                    packed (1, T), T = real tokens of the micro-batch
    a a a a . .   pos 0 1 2 3 0 0    a a a a b b c c c      pos 0 1 2 3 0 1 0 1 2
    b b . . . .       0 1 1 1 1 1
    c c c . . .       0 1 2 2 2 2

Hugging Face models whose masks come from `transformers.masking_utils` (Qwen2, Qwen3, Llama,
Mistral, ...) read such position_ids as packed sequences when no attention mask and no KV
cache are given (`find_packed_sequence_indices`: a position that is not the previous one
plus 1 starts a new sequence) and mask attention to each sample's own tokens: a dense
block-diagonal causal mask for sdpa / eager, a `BlockMask` with document masking for
flex_attention (blocks outside every document are skipped), varlen kernels for
flash_attention_2/3. The forward pass needs `use_cache=False`: with a cache the check is
skipped and the samples would attend to each other.

Response positions keep their order (sample by sample, token by token), so values taken at
the packed response positions scatter straight back into the padded layout and everything
downstream (losses, metrics) is unchanged. A model that ignores packed position_ids would
silently let samples attend to each other: `check_packed_attention` probes it once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from memrl.errors import MemrlInputError

__all__ = ["check_packed_attention", "packed_inputs", "varlen_kwargs"]


def packed_inputs(tensors: dict[str, Tensor]) -> tuple[dict[str, Tensor], Tensor]:
    """(model inputs, response mask) of a right-padded `collate` batch as one packed row.

    Inputs: input_ids and position_ids, (1, T) long, no attention_mask. The mask is (1, T)
    bool, set at the logit positions of response tokens, in the order of
    ``tensors["response_mask"]`` taken row by row.
    """
    keep = tensors["attention_mask"].bool()
    inputs = {k: tensors[k][keep].unsqueeze(0) for k in ("input_ids", "position_ids")}
    return inputs, tensors["response_mask"][keep].unsqueeze(0)


def varlen_kwargs(tensors: dict[str, Tensor]) -> dict[str, Any]:
    """The samples' boundaries in the packed row of `packed_inputs(tensors)`, as
    transformers' flash-attention keywords: cu_seq_lens_q/k (N+1,) int32 cumulative lengths
    and max_length_q/k, computed where the attention mask is (the host for a collated batch,
    so no wait for the GPU). Samples without tokens are left out."""
    lengths = tensors["attention_mask"].sum(dim=1)
    lengths = lengths[lengths > 0].to(torch.int32)
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    torch.cumsum(lengths, 0, out=cu[1:])
    longest = int(lengths.max()) if lengths.numel() else 0
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
            "max_length_q": longest, "max_length_k": longest}


_PROBE_LENGTHS = (5, 3)
_PROBE_TOLERANCE = 0.05
"""Relative error allowed between a sample's logits packed and alone: fp32 agrees to ~1e-6,
bf16 to ~1e-2; attending to another sample's tokens changes the logits by O(1)."""


@torch.no_grad()
def check_packed_attention(model: Any) -> None:
    """Raise MemrlInputError unless `model` keeps packed samples apart: the logits of a
    sample packed after another must equal its logits alone (one forward of 8 tokens)."""
    device = next(model.parameters()).device
    vocab = int(model.get_input_embeddings().weight.shape[0])
    total = sum(_PROBE_LENGTHS)
    ids = (torch.arange(total, device=device) * 7 + 3) % vocab
    positions = torch.cat([torch.arange(n, device=device) for n in _PROBE_LENGTHS])
    was_training = model.training
    model.eval()
    try:
        packed = model(input_ids=ids[None], position_ids=positions[None], use_cache=False)
        alone = model(input_ids=ids[None, _PROBE_LENGTHS[0]:], use_cache=False)
    finally:
        model.train(was_training)
    got = packed.logits[0, _PROBE_LENGTHS[0]:].float()
    want = alone.logits[0].float()
    error = float((got - want).abs().max() / want.abs().max().clamp(min=1e-6))
    if not error <= _PROBE_TOLERANCE:
        name = type(model).__name__
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise MemrlInputError(
            f"{name} (attention {impl}) lets packed samples attend to each other (relative "
            f"logit error {error:.3g}): set rl.remove_padding=false, or use a model whose "
            "masks come from transformers.masking_utils (Qwen2, Llama, ... in transformers 5)",
            location="rl.remove_padding",
        )

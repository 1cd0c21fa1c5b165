"""Per-token numbers of a collated batch's responses from one forward of the policy: the
log-probs (and entropies) of the response tokens, and a value head's values on the same
hidden states (critic.value_model: policy_head).

    lp, ent = response_logprobs(model, tensors, temperature=..., with_entropy=...)
    lp, ent, values = response_pass(model, tensors, ..., value_head=head)

Memory: the final hidden states are projected to the vocabulary only at response positions,
so the logits of a 6K-token prompt with a 1K-token response take 1K rows, not 7K; and for a
plain linear head the projection is fused with the log-prob, chunk by chunk
(`memrl.rl.maths.losses.linear_logprobs`), so no (tokens, vocab) tensor is kept for backward.
With remove_padding the conversations run packed into one row (`memrl.rl.trainer.packing`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from memrl.models.attention import packed_forward, packed_masks, uses_varlen
from memrl.rl.maths.losses import entropy_from_logits, linear_logprobs, logprobs_from_logits
from memrl.rl.trainer.packing import packed_inputs, varlen_kwargs
from memrl.rl.trainer.values import head_values

__all__ = ["gather_rows", "policy_hidden_states_error", "response_logprobs", "response_pass"]


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The transformer body and the vocabulary projection, when logits are a plain
    projection of the last hidden state (no soft-capping or scaling), else None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if any(getattr(config, k, None) not in (None, 1.0) for k in
           ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return None
    get_decoder = getattr(base, "get_decoder", None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    decoder = get_decoder() if callable(get_decoder) else None
    if decoder is None or head is None or decoder is base:
        return None
    return decoder, head


def response_logprobs(model: Any, tensors: dict[str, Tensor],
                      **options: Any) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of the response tokens of a collated batch, as (B, L)
    float32 tensors aligned with ``tensors["response_mask"]`` (0 elsewhere): `response_pass`
    without a value head, `options` its keywords (temperature, with_entropy, entropy_grad,
    device, remove_padding)."""
    logprobs, entropy, _ = response_pass(model, tensors, **options)
    return logprobs, entropy


def response_pass(
    model: Any,
    tensors: dict[str, Tensor],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    device: torch.device | None = None,
    remove_padding: bool = False,
    value_head: torch.nn.Module | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probs (and entropies) of the response tokens of a collated batch, as (B, L)
    float32 tensors aligned with ``tensors["response_mask"]`` (0 elsewhere).

    Logits are computed at response positions only. ``temperature`` is the sampling
    temperature of the rollout (log-probs of softmax(logits / T)). ``device``: where the
    forward runs (None: the device of the model's parameters). ``remove_padding``: the
    forward pass runs on the conversations packed into one row
    (`memrl.rl.trainer.packing`); the result has the same layout.

    With `value_head` (a value head on the policy) the third tensor is the values it reads
    from the same final hidden states at the same positions, V(s_t) at every response token
    (B, L) float32, 0 elsewhere; else None. Needs a model whose logits are a plain
    projection of its last hidden state (`policy_hidden_states_error`)."""
    device = device or next(model.parameters()).device
    mask = tensors["response_mask"].to(device, non_blocking=True)
    varlen = remove_padding and uses_varlen(model)
    if remove_padding:
        inputs, select = packed_inputs(tensors)
        if varlen:  # the samples' bounds for the flash kernel, and no masks
            inputs.update(varlen_kwargs(tensors))
        inputs = {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v
                  for k, v in inputs.items()}
        if varlen and (masks := packed_masks(model)) is not None:
            inputs["attention_mask"] = masks
    else:
        keys = ("input_ids", "attention_mask", "position_ids")
        inputs = {k: tensors[k].to(device, non_blocking=True) for k in keys}
        select = tensors["response_mask"]
    # The response positions are found where the masks are (the CPU, for a collated batch)
    # and gathered by index on the device: boolean indexing there would wait for the GPU.
    labels = tensors["labels"][tensors["response_mask"].to(tensors["labels"].device)]
    labels = labels.to(device, non_blocking=True)
    parts = _decoder_and_head(model)
    if value_head is not None and parts is None:
        raise ValueError(policy_hidden_states_error(model))
    ent = values = None
    if parts is not None:  # the final hidden states at response positions
        decoder, head = parts
        with packed_forward(varlen):
            out = decoder(**inputs, use_cache=False)
        hidden = gather_rows(out.last_hidden_state, select)
        if value_head is not None:
            values = head_values(value_head, hidden)
    if parts is not None and _plain_linear(head) and not entropy_grad:
        # Fused, chunked projection + log-prob: no (tokens, vocab) logits, even for backward.
        flat, ent = linear_logprobs(hidden, head.weight, labels, temperature=temperature,
                                    with_entropy=with_entropy)
    else:
        if parts is not None:
            logits = head(hidden)
        else:  # logits are not a plain projection: full logits, then select
            with packed_forward(varlen):
                out = model(**inputs, use_cache=False)
            logits = gather_rows(out.logits, select)
        flat = logprobs_from_logits(logits, labels, temperature=temperature)
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = entropy_from_logits(logits, temperature=temperature)

    def padded(values: Tensor) -> Tensor:
        return torch.zeros(mask.shape, dtype=values.dtype, device=device).masked_scatter(
            mask, values
        )

    return (padded(flat), padded(ent) if with_entropy else None,
            padded(values.float()) if values is not None else None)


def gather_rows(x: Tensor, select: Tensor) -> Tensor:
    """`x[select]` for a (B, L, ...) `x` and a (B, L) bool `select`, which may live on
    another device (the CPU): the same rows, in the same order, with no host
    synchronisation on `x`'s device (the positions are computed where `select` is)."""
    index = select.reshape(-1).nonzero().squeeze(1).to(x.device, non_blocking=True)
    return x.reshape(-1, *x.shape[2:]).index_select(0, index)


def policy_hidden_states_error(model: Any) -> str | None:
    """Why a value head cannot read `model`'s last hidden state (its logits are not a plain
    projection of it, or it has no separate decoder), else None."""
    if _decoder_and_head(model) is not None:
        return None
    return (f"critic.value_model policy_head reads the policy's last hidden state, and "
            f"{type(model).__name__} computes its logits otherwise (logit soft-capping or "
            "scaling, or no separate decoder): use critic.value_model=separate")


def _plain_linear(head: Any) -> bool:
    """A bias-free nn.Linear (not a LoRA-wrapped one): its weight is the whole projection."""
    return type(head) is torch.nn.Linear and head.bias is None

"""Low-rank adapters: a fine-tuned model kept as the difference of its weights from its base.

A fully fine-tuned model differs from its base in every weight; most of that difference lies
in a few directions per matrix. `extract_low_rank(base, tuned, rank)` keeps, for every
matrix, the best rank-`rank` approximation of `tuned - base` (truncated SVD, Eckart-Young),
as two factors `B` (out x r) and `A` (r x in) with `B @ A` that approximation, and, for every
vector (norm weights), the whole difference. `apply_low_rank(weights, adapter)` adds them back
to a base. Factors are stored in float16 (the singular values are split evenly between the two
factors, so neither has a large range); vectors in float32.

The file is a safetensors file: tensors `NAME.lora_B`, `NAME.lora_A` (matrices) and
`NAME.delta` (vectors), and in its metadata `memrl.format` (`low-rank-diff/1`), the rank and
whatever the writer adds (base model, recipe). A base weight the adapter names but the base
lacks, or a shape that differs, is one `MemrlInputError` naming the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from memrl.errors import MemrlInputError

FORMAT = "low-rank-diff/1"
"""`memrl.format` of an adapter file's metadata."""
_B, _A, _DELTA = ".lora_B", ".lora_A", ".delta"


def extract_low_rank(base: Mapping[str, torch.Tensor], tuned: Mapping[str, torch.Tensor],
                     rank: int, *, device: str | torch.device = "cpu"
                     ) -> dict[str, torch.Tensor]:
    """The adapter that turns `base` into (approximately) `tuned`: per matrix the rank-`rank`
    truncated SVD of the difference (or the exact difference's factors when the matrix is
    smaller than `rank`), per vector the difference itself. Weights equal in both are left
    out. Both mappings must name the same tensors with the same shapes."""
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}")
    if set(base) != set(tuned):
        only = sorted(set(base) ^ set(tuned))
        raise MemrlInputError(f"the two models name different weights: {', '.join(only[:5])}",
                              location="weights")
    adapter: dict[str, torch.Tensor] = {}
    for name in sorted(base):
        b, t = base[name], tuned[name]
        if b.shape != t.shape:
            raise MemrlInputError(f"shape {tuple(t.shape)} against the base's {tuple(b.shape)}",
                                  location=name)
        diff = t.to(device, torch.float32) - b.to(device, torch.float32)
        if not diff.any():
            continue
        if diff.ndim == 2:
            adapter[name + _B], adapter[name + _A] = _factors(diff, rank)
        else:
            adapter[name + _DELTA] = diff.cpu()
    return adapter


def _factors(diff: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) in float16 with B @ A the best rank-`rank` approximation of `diff`."""
    u, s, vh = torch.linalg.svd(diff, full_matrices=False)
    r = min(rank, s.numel())
    root = s[:r].sqrt()
    b = (u[:, :r] * root).to(torch.float16)
    a = (root[:, None] * vh[:r]).to(torch.float16)
    return b.cpu().contiguous(), a.cpu().contiguous()


def apply_low_rank(weights: dict[str, torch.Tensor], adapter: Mapping[str, torch.Tensor]
                   ) -> None:
    """Add `adapter`'s differences to `weights` in place (each in its own dtype, computed in
    float32). A tensor the adapter names that `weights` lacks, or whose shape differs, is a
    MemrlInputError naming it."""
    for key in adapter:
        if not key.endswith((_B, _A, _DELTA)):
            raise MemrlInputError("is not a tensor of a low-rank adapter", location=key)
    for name, delta in _deltas(adapter):
        if name not in weights:
            raise MemrlInputError("the adapter changes a weight the base model does not have",
                                  location=name)
        target = weights[name]
        if target.shape != delta.shape:
            raise MemrlInputError(f"the adapter's change has shape {tuple(delta.shape)}, the "
                                  f"base's weight {tuple(target.shape)}", location=name)
        weights[name] = (target.float() + delta).to(target.dtype)


def _deltas(adapter: Mapping[str, torch.Tensor]):
    """(weight name, its float32 difference) for every weight the adapter changes."""
    for key in sorted(adapter):
        if key.endswith(_DELTA):
            yield key[: -len(_DELTA)], adapter[key].float()
        elif key.endswith(_B):
            name = key[: -len(_B)]
            if name + _A not in adapter:
                raise MemrlInputError("has no matching .lora_A factor", location=key)
            yield name, adapter[key].float() @ adapter[name + _A].float()
        elif key[: -len(_A)] + _B not in adapter:
            raise MemrlInputError("has no matching .lora_B factor", location=key)


def adapter_rank(adapter: Mapping[str, torch.Tensor]) -> int:
    """The largest rank of the adapter's factors (0 with none)."""
    return max((t.shape[1] for k, t in adapter.items() if k.endswith(_B)), default=0)


def save_adapter(adapter: Mapping[str, torch.Tensor], path: str | Path,
                 metadata: Mapping[str, str] | None = None) -> Path:
    """Write `adapter` as a safetensors file with its format and rank in the metadata."""
    from safetensors.torch import save_file

    meta = {"memrl.format": FORMAT, "memrl.rank": str(adapter_rank(adapter)),
            **(metadata or {})}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(out), metadata=meta)
    return out


def load_adapter(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of an adapter file; a file of another format is one line."""
    from safetensors import safe_open

    from memrl.modelfiles import check_safetensors

    file = Path(path)
    check_safetensors(file)
    with safe_open(str(file), framework="pt") as f:
        metadata = dict(f.metadata() or {})
        if metadata.get("memrl.format") != FORMAT:
            raise MemrlInputError(
                f"is not a memrl low-rank adapter (format {metadata.get('memrl.format')!r}, "
                f"expected {FORMAT!r})", location=str(file))
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, metadata

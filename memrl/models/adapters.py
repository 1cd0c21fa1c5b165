"""Weight-difference adapters: a fine-tuned model kept as the difference of its weights from
its base, small enough to ship inside a package.

A fully fine-tuned model differs from its base in every weight. `extract_adapter(base, tuned,
rank, sign=...)` keeps, for every matrix, the best rank-`rank` approximation of `tuned - base`
(truncated SVD, Eckart-Young) as two factors `B` (out x r) and `A` (r x in) in float16 (the
singular values split evenly between them, so neither has a large range), and with
`sign=True` what that leaves of the difference at one bit a weight: its sign, times one
scale per row (the row's mean absolute residual, the scale that minimises the squared error
of a sign code; BitDelta, Liu et al. 2024). Vectors (norm weights) are kept whole, in
float32. `apply_adapter(weights, adapter)` adds it all back to a base.

A low rank keeps the few directions most of a difference lies in; a difference spread over
many directions (full fine-tuning moves MLP matrices so) is kept better by its signs. One bit
a weight of a 135M-parameter model is 17 MB, its rows' scales 0.4 MB.

The file is a safetensors file: tensors `NAME.lora_B`, `NAME.lora_A` (factors),
`NAME.sign` (uint8, the residual's signs packed 8 to a byte along each row, bit i of byte j
for column 8j+i, 1 for >= 0), `NAME.scale` (bfloat16, one per row) and `NAME.delta`
(vectors); in its metadata `memrl.format` (`low-rank-diff/1` without signs, `weight-diff/2`
with), the rank and whatever the writer adds (base model, recipe). A base weight the adapter
names but the base lacks, or a shape that differs, is one `MemrlInputError` naming it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from memrl.errors import MemrlInputError

FORMAT = "low-rank-diff/1"
"""`memrl.format` of an adapter file of factors and vectors only."""
SIGN_FORMAT = "weight-diff/2"
"""`memrl.format` of an adapter file with one-bit residuals (`NAME.sign`, `NAME.scale`)."""
_B, _A, _SIGN, _SCALE, _DELTA = ".lora_B", ".lora_A", ".sign", ".scale", ".delta"
_KINDS = (_B, _A, _SIGN, _SCALE, _DELTA)


def extract_adapter(base: Mapping[str, torch.Tensor], tuned: Mapping[str, torch.Tensor],
                    rank: int, *, sign: bool = False, device: str | torch.device = "cpu"
                    ) -> dict[str, torch.Tensor]:
    """The adapter that turns `base` into (approximately) `tuned`: per matrix the rank-`rank`
    truncated SVD of the difference (the exact difference's factors when the matrix is
    smaller than `rank`; none with rank 0), with `sign` also the signs and row scales of what
    the factors leave, per vector the difference itself. Weights equal in both are left out.
    Both mappings must name the same tensors with the same shapes."""
    if rank < 0 or (rank == 0 and not sign):
        raise ValueError(f"rank must be at least 1 (or 0 with sign=True), got {rank}")
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
        if diff.ndim != 2:
            adapter[name + _DELTA] = diff.cpu()
            continue
        if rank:
            factor_b, factor_a = adapter[name + _B], adapter[name + _A] = _factors(diff, rank)
            diff = diff - factor_b.to(device).float() @ factor_a.to(device).float()
        if sign:
            adapter[name + _SIGN], adapter[name + _SCALE] = sign_code(diff)
    return adapter


def _factors(diff: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A) in float16 with B @ A the best rank-`rank` approximation of `diff`."""
    u, s, vh = torch.linalg.svd(diff, full_matrices=False)
    r = min(rank, s.numel())
    root = s[:r].sqrt()
    b = (u[:, :r] * root).to(torch.float16)
    a = (root[:, None] * vh[:r]).to(torch.float16)
    return b.cpu().contiguous(), a.cpu().contiguous()


def sign_code(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed signs, row scales) of `matrix` (out x in): uint8 out x ceil(in / 8), bit i of
    byte j set where column 8j+i is >= 0; bfloat16 out, each row's mean absolute value.
    `sign_decode(signs, scales, in)` is the closest matrix of the form scale x (+-1)."""
    rows, cols = matrix.shape
    bits = (matrix >= 0).to(torch.uint8)
    bits = torch.nn.functional.pad(bits, (0, -cols % 8)).view(rows, -1, 8)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=bits.device)
    packed = (bits * weights).sum(-1, dtype=torch.uint8)
    return packed.cpu().contiguous(), matrix.abs().mean(-1).to(torch.bfloat16).cpu().contiguous()


def sign_decode(signs: torch.Tensor, scales: torch.Tensor, columns: int) -> torch.Tensor:
    """The float32 matrix (rows x `columns`) a `sign_code` stands for."""
    shifts = torch.arange(8, dtype=torch.uint8)
    bits = (signs.unsqueeze(-1) >> shifts) & 1
    plus_minus = bits.reshape(signs.shape[0], -1)[:, :columns].float() * 2 - 1
    return plus_minus * scales.float()[:, None]


def apply_adapter(weights: dict[str, torch.Tensor], adapter: Mapping[str, torch.Tensor]
                  ) -> None:
    """Add `adapter`'s differences to `weights` in place (each in its own dtype, computed in
    float32). A tensor the adapter names that `weights` lacks, or whose shape differs, is a
    MemrlInputError naming it."""
    for key in adapter:
        if not key.endswith(_KINDS):
            raise MemrlInputError("is not a tensor of a memrl adapter", location=key)
    names = sorted({key[: key.rindex(".")] for key in adapter})
    for name in names:
        if name not in weights:
            raise MemrlInputError("the adapter changes a weight the base model does not have",
                                  location=name)
        target = weights[name]
        delta = _delta(adapter, name, target.shape)
        weights[name] = (target.float() + delta).to(target.dtype)


def _delta(adapter: Mapping[str, torch.Tensor], name: str, shape: torch.Size) -> torch.Tensor:
    """The float32 difference the adapter holds for weight `name` of shape `shape`."""
    if name + _DELTA in adapter:
        delta = adapter[name + _DELTA].float()
        if delta.shape != shape:
            raise MemrlInputError(f"the adapter's change has shape {tuple(delta.shape)}, the "
                                  f"base's weight {tuple(shape)}", location=name)
        return delta
    if len(shape) != 2:
        raise MemrlInputError(f"the adapter has matrix parts for a weight of shape "
                              f"{tuple(shape)}", location=name)
    rows, cols = shape
    delta = torch.zeros(rows, cols)
    for part in _parts(adapter, name, cols):
        if part.shape != (rows, cols):
            raise MemrlInputError(f"the adapter's change has shape {tuple(part.shape)}, the "
                                  f"base's weight {tuple(shape)}", location=name)
        delta += part
    return delta


def _parts(adapter: Mapping[str, torch.Tensor], name: str, columns: int
           ) -> Iterator[torch.Tensor]:
    """The low-rank product and the sign code (decoded to `columns` columns) the adapter
    holds for matrix `name`."""
    for first, second in ((_B, _A), (_SIGN, _SCALE)):
        has_first, has_second = name + first in adapter, name + second in adapter
        if has_first != has_second:
            missing, present = (second, first) if has_first else (first, second)
            raise MemrlInputError(f"has no matching {missing} tensor",
                                  location=name + present)
    if name + _B in adapter:
        yield adapter[name + _B].float() @ adapter[name + _A].float()
    if name + _SIGN in adapter:
        signs, scales = adapter[name + _SIGN], adapter[name + _SCALE]
        if signs.shape[1] != -(-columns // 8) or scales.shape != signs.shape[:1]:
            raise MemrlInputError(f"the adapter's signs have shape {tuple(signs.shape)} and "
                                  f"scales {tuple(scales.shape)}, for a weight of "
                                  f"{columns} columns", location=name)
        yield sign_decode(signs, scales, columns)


def adapter_rank(adapter: Mapping[str, torch.Tensor]) -> int:
    """The largest rank of the adapter's factors (0 with none)."""
    return max((t.shape[1] for k, t in adapter.items() if k.endswith(_B)), default=0)


def has_signs(adapter: Mapping[str, torch.Tensor]) -> bool:
    """Whether the adapter keeps one-bit residuals (`extract_adapter(..., sign=True)`)."""
    return any(k.endswith(_SIGN) for k in adapter)


def save_adapter(adapter: Mapping[str, torch.Tensor], path: str | Path,
                 metadata: Mapping[str, str] | None = None) -> Path:
    """Write `adapter` as a safetensors file with its format and rank in the metadata."""
    from safetensors.torch import save_file

    meta = {"memrl.format": SIGN_FORMAT if has_signs(adapter) else FORMAT,
            "memrl.rank": str(adapter_rank(adapter)), **(metadata or {})}
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
        if metadata.get("memrl.format") not in (FORMAT, SIGN_FORMAT):
            raise MemrlInputError(
                f"is not a memrl adapter (format {metadata.get('memrl.format')!r}, expected "
                f"{FORMAT!r} or {SIGN_FORMAT!r})", location=str(file))
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, metadata

"""One loader for Hugging Face models and tokenizers (policy, reference, evaluation engines).

A local directory is checked first (`memrl.modelfiles`): a missing or broken file is a
one-line `MemrlInputError` naming the file, before transformers reads anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl import modelfiles
from memrl.errors import MemrlInputError


def resolve_device(device: Any = None) -> Any:
    """A torch.device: the given one (checked: a known kind, and a CUDA or MPS device this
    machine has), else CUDA when available, else CPU."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise MemrlInputError(f"unknown device {device!r}: {exc}", location="device") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise MemrlInputError(f"device {str(device)!r} asked for, but this machine has no "
                                  "CUDA GPU (use cpu)", location="device")
        if resolved.index is not None and resolved.index >= count:
            raise MemrlInputError(f"device {str(device)!r} asked for, but this machine has "
                                  f"{count} CUDA GPU(s): cuda:0 to cuda:{count - 1}",
                                  location="device")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise MemrlInputError(f"device {str(device)!r} asked for, but MPS is not available "
                              "here (use cpu)", location="device")
    return resolved


FAST_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
"""/proc/cpuinfo flags of a CPU that runs a model faster in bfloat16 than in float32: Intel's
AMX-BF16 tiles (Xeon Sapphire Rapids and later) and AVX512-BF16 (AMD Zen 4 and later, Intel
Cooper Lake): on a Zen 4, SmolLM2-135M prefilled 1.7x faster in bfloat16 and decoded 1.3x
faster (docs/lab/benchmarks.md, 2026-11-28). Without them bfloat16 matrix products are
converted to float32 on the fly: prefill 3.7x slower. Not Arm's BF16 (unmeasured)."""


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of the first CPU listed in `cpuinfo` (its `flags` line on
    x86, `Features` on Arm); empty where the file is missing or unreadable (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip().lower() in ("flags", "features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_compute_dtype(flags: frozenset[str] | None = None) -> Any:
    """The dtype this CPU runs a model fastest in: bfloat16 where it has bfloat16 matrix
    instructions (`FAST_BF16_FLAGS`), else float32. `flags`: `cpu_flags()` unless given."""
    import torch

    flags = cpu_flags() if flags is None else flags
    return torch.bfloat16 if flags & FAST_BF16_FLAGS else torch.float32


def resolve_dtype(dtype: Any, device: Any) -> Any:
    """A torch.dtype: the given one (a name or dtype), else (None or "auto") bfloat16 on CUDA,
    float32 elsewhere: an evaluation's numbers do not depend on the CPU's instruction set.
    ("fast": on a CPU `cpu_compute_dtype()`, what `memrl ask` and `memrl serve` use.)"""
    import torch

    if dtype is None or dtype in ("auto", "fast"):
        kind = torch.device(device).type
        if kind == "cuda":
            return torch.bfloat16
        return cpu_compute_dtype() if kind == "cpu" and dtype == "fast" else torch.float32
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise MemrlInputError(f"unknown torch dtype {dtype!r}", location="dtype")
        return resolved
    return dtype


def load_tokenizer(path: str | Path) -> Any:
    """`AutoTokenizer` from a directory (its files checked first) or a cached hub id."""
    from transformers import AutoTokenizer

    if Path(path).is_dir():
        modelfiles.check_tokenizer_dir(Path(path))
        check_model_type(Path(path))
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise MemrlInputError(
            f"cannot load a tokenizer from it: {_first_line(exc)}", location=str(path)
        ) from None


def load_model(path: str | Path, *, device: Any = None, dtype: Any = None, **kw: Any) -> Any:
    """`AutoModelForCausalLM` from a directory (or a hub id already in the local cache), on
    `device` in `dtype` (defaults: `resolve_device` / `resolve_dtype`), in eval mode."""
    import transformers
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    # transformers renamed `torch_dtype` to `dtype` in 4.56.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    if Path(path).is_dir():
        modelfiles.check_model_dir(Path(path))
        check_model_type(Path(path))
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **{dtype_kw: dtype}, **kw)
    except (OSError, ValueError, TypeError, RuntimeError, _safetensors_error()) as exc:
        raise MemrlInputError(
            f"cannot load a model from it: {_first_line(exc)}", location=str(path)
        ) from None
    model.to(device)
    model.eval()
    return model


def check_model_type(directory: Path) -> None:
    """The `model_type` of `directory/config.json` is one this transformers knows (or the
    model brings its own code, `auto_map`): else one MemrlInputError, before transformers
    warns and fails in two lines of its own."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    config = directory / "config.json"
    if not config.is_file():
        return
    data = modelfiles.read_json_file(config, "model config")
    if not isinstance(data, dict) or "auto_map" in data:
        return
    model_type = data.get("model_type")
    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING_NAMES:
        raise MemrlInputError(
            f"unknown architecture: model_type {model_type!r} is not one transformers "
            f"{transformers.__version__} knows (a newer transformers may)",
            location=str(config))


def load_pretrained(
    path: str | Path, *, device: Any = None, dtype: Any = None, **kw: Any
) -> tuple[Any, Any]:
    """(model, tokenizer) from one directory; see `load_model`."""
    tokenizer = load_tokenizer(path)
    return load_model(path, device=device, dtype=dtype, **kw), tokenizer


def _safetensors_error() -> type[Exception]:
    """safetensors' own error type (a plain Exception subclass) for a corrupt weights file."""
    try:
        from safetensors import SafetensorError

        return SafetensorError
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        return OSError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""The files of a Hugging Face model directory, checked before transformers reads them.

transformers reports a broken model directory badly: missing tokenizer files give an empty
tokenizer (it encodes everything to []), a truncated `model.safetensors` raises safetensors'
own error without the file name, a `tokenizer.json` that is not JSON a JSONDecodeError
without the file name, a LoRA adapter without its weights a misleading hub-id error. These
checks look at the files first and name the one that is wrong, as a one-line
`MemrlInputError`. They read headers only (a few KB), never the weights.

Used by `memrl.inference.loader` (every model and tokenizer memrl loads) and
`memrl.run.checkpoint` (export, adapters).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")
"""Any one of these holds a vocabulary; `tokenizer_config.json` alone does not."""

WEIGHT_STEMS = ("model", "pytorch_model")
ADAPTER_STEMS = ("adapter_model",)
EXPORTED_CONFIG = "memrl_config.yaml"
"""Beside a model `memrl export` wrote: the config of the run that trained it (its agent
settings, which `memrl ask` / `memrl serve` read)."""
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
"""safetensors' own limit on the JSON header of a file."""


def read_json_file(file: Path, what: str) -> Any:
    """A JSON file's value; unreadable, non-UTF-8 or invalid JSON is one line naming it."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise MemrlInputError(f"cannot read the {what}: {reason}", location=str(file)) from None
    except UnicodeDecodeError as exc:
        raise MemrlInputError(
            f"{what} is not UTF-8 text (byte {exc.start})", location=str(file)
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise MemrlInputError(
            f"{what} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            location=str(file),
        ) from None
    except RecursionError:
        raise MemrlInputError(f"{what} is not valid JSON: nested too deeply",
                              location=str(file)) from None


def check_safetensors(file: Path) -> None:
    """A complete safetensors file: its header parses and the file holds every byte the
    header promises (a download or copy cut short fails here, naming the file)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise MemrlInputError(
                    f"truncated weights file ({size} bytes, no safetensors header)",
                    location=str(file),
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_SAFETENSORS_HEADER:
                raise MemrlInputError(
                    f"corrupt weights file: a {n}-byte header is not safetensors",
                    location=str(file),
                )
            if 8 + n > size:
                raise MemrlInputError(
                    f"truncated weights file: {size} bytes, its header alone needs {8 + n}",
                    location=str(file),
                )
            raw = f.read(n)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise MemrlInputError(f"cannot read the weights: {reason}", location=str(file)) from None
    try:
        header = json.loads(raw.decode("utf-8"))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError,
            TypeError, ValueError):
        raise MemrlInputError("corrupt weights file: its header is not safetensors JSON",
                              location=str(file)) from None
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise MemrlInputError(
            f"truncated weights file: {size} bytes, the header needs {need}", location=str(file)
        )


def _weight_files(directory: Path, stems: tuple[str, ...]) -> list[Path] | None:
    """The weight files of `directory` for the first stem present (shards via their index),
    or None when there are none."""
    for stem in stems:
        for suffix in ("safetensors", "bin"):
            index = directory / f"{stem}.{suffix}.index.json"
            if index.is_file():
                data = read_json_file(index, "weights index")
                weight_map = data.get("weight_map") if isinstance(data, dict) else None
                if not isinstance(weight_map, dict) or not weight_map:
                    raise MemrlInputError("weights index without a weight_map",
                                          location=str(index))
                return [directory / name for name in sorted(set(map(str, weight_map.values())))]
            single = directory / f"{stem}.{suffix}"
            if single.exists():
                return [single]
    return None


def check_weights(directory: Path, stems: tuple[str, ...] = WEIGHT_STEMS) -> None:
    """The weights of `directory` are present and complete (safetensors headers checked)."""
    files = _weight_files(directory, stems)
    if files is None:
        raise MemrlInputError(
            f"no weights: expected {stems[0]}.safetensors (or its shards)",
            location=str(directory / f"{stems[0]}.safetensors"),
        )
    for file in files:
        if not file.is_file():
            raise MemrlInputError("weights file missing (listed in the index)",
                                  location=str(file))
        if file.suffix == ".safetensors":
            check_safetensors(file)


def check_tokenizer_dir(directory: Path) -> None:
    """A directory transformers can build a real tokenizer from (not an empty one)."""
    present = [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not present:
        raise MemrlInputError(
            f"no tokenizer files (expected one of {', '.join(TOKENIZER_FILES[:3])}, ...)",
            location=str(directory),
        )
    for file in (directory / "tokenizer.json", directory / "tokenizer_config.json"):
        if file.is_file():
            read_json_file(file, "tokenizer file")
    if (directory / "config.json").is_file():  # AutoTokenizer reads it too
        read_json_file(directory / "config.json", "model config")


def check_model_dir(directory: Path) -> None:
    """A loadable model directory: config.json (valid JSON) and complete weights."""
    _check_config(directory / "config.json", "model config",
                  missing="not a Hugging Face model directory: no config.json")
    check_weights(directory)


def check_adapter_dir(directory: Path) -> None:
    """A saved LoRA adapter: adapter_config.json (valid JSON) and complete adapter weights."""
    _check_config(directory / "adapter_config.json", "adapter config",
                  missing="LoRA checkpoint without its adapter_config.json")
    check_weights(directory, ADAPTER_STEMS)


def _check_config(file: Path, what: str, *, missing: str) -> None:
    """`file` is there (else the error `missing`) and holds a JSON object (`what`: its name)."""
    if not file.is_file():
        raise MemrlInputError(missing, location=str(file))
    if not isinstance(read_json_file(file, what), dict):
        raise MemrlInputError(f"{what} is not a JSON object", location=str(file))

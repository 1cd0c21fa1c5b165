"""The one place that builds a rollout engine by name (`EngineName`: hf, vllm, openai), for
training (`memrl.recipes.models.build_engine`) and for every command that generates
(`memrl.cli.common.load_engine`). The engines' modules are imported only when built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError
from memrl.inference.base import Engine
from memrl.inference.config import ENGINES, EngineName, OpenAIConfig, VLLMConfig


def build_engine(
    kind: EngineName,
    tokenizer: Any,
    *,
    model: Any = None,
    model_path: str | Path | None = None,
    generation_batch_size: int = 32,
    prompt_lookup_tokens: int = 0,
    vllm: VLLMConfig | None = None,
    openai: OpenAIConfig | None = None,
    training: bool = False,
    location: str = "engine",
) -> Engine:
    """The engine `kind` generating with `tokenizer`'s chat template:

    - hf: `model` (a loaded causal LM, e.g. the live policy) in-process, at most
      `generation_batch_size` prompts per forward pass, greedy single prompts drafted by
      prompt lookup (up to `prompt_lookup_tokens` tokens a pass; 0: off);
    - vllm: a colocated vLLM engine that loads `model_path` with the `vllm` settings;
    - openai: the pool of servers of `openai` (`base_urls`), asked at once whether they
      answer (none answering: a MemrlInputError at `location`); `training`: each must also
      be able to reload weights and give log-probs under the sampling temperature.
    """
    if kind not in ENGINES:
        raise MemrlInputError(f"choose one of {', '.join(ENGINES)}", location=location)
    if kind == "openai":
        from memrl.inference.openai import OpenAIEngine

        if openai is None:
            raise MemrlInputError("the openai engine needs its servers' settings",
                                  location=location)
        engine = OpenAIEngine(openai, tokenizer)
        engine.check_servers(training=training, location=location)
        return engine
    if kind == "vllm":
        from memrl.inference.vllm import VLLMEngine

        if model_path is None:
            raise ValueError("the vllm engine loads its model from model_path")
        return VLLMEngine(model_path, tokenizer, vllm)
    from memrl.inference.hf import HFEngine

    if model is None:
        raise ValueError("the hf engine generates with a loaded model")
    return HFEngine(model, tokenizer, generation_batch_size=generation_batch_size,
                    prompt_lookup_tokens=prompt_lookup_tokens)

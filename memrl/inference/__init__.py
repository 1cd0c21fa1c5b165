"""Generators and engines: everything that turns prompt token ids into response token ids."""

from memrl.inference.base import (
    Engine,
    Generation,
    Generator,
    RolloutMode,
    Sampler,
    SamplingParams,
    batch_params,
    derive_seed,
    generate_checked,
    request_params,
    response_text,
    runs_async,
)
from memrl.inference.chat import encode_chat, encode_messages, render_chat
from memrl.inference.config import (
    ENGINES,
    EngineName,
    OpenAIConfig,
    SamplingConfig,
    ValidationSamplingConfig,
    VLLMConfig,
)
from memrl.inference.factory import build_engine
from memrl.inference.hf import HFEngine
from memrl.inference.loader import load_model, load_pretrained, load_tokenizer
from memrl.inference.openai import OpenAIEngine
from memrl.inference.vllm import VLLMEngine

__all__ = [
    "ENGINES",
    "Engine",
    "EngineName",
    "Generation",
    "Generator",
    "HFEngine",
    "OpenAIConfig",
    "OpenAIEngine",
    "RolloutMode",
    "Sampler",
    "SamplingConfig",
    "SamplingParams",
    "VLLMConfig",
    "ValidationSamplingConfig",
    "VLLMEngine",
    "batch_params",
    "build_engine",
    "derive_seed",
    "encode_chat",
    "encode_messages",
    "generate_checked",
    "load_model",
    "load_pretrained",
    "load_tokenizer",
    "render_chat",
    "request_params",
    "response_text",
    "runs_async",
]


"""Generators and engines: everything that turns prompt token ids into response token ids."""

from memrl.inference.base import (
    Engine,
    Generation,
    Generator,
    Sampler,
    SamplingParams,
    derive_seed,
    generate_checked,
    response_text,
)
from memrl.inference.chat import encode_chat, encode_messages, render_chat
from memrl.inference.hf import HFGenerator
from memrl.inference.loader import load_model, load_pretrained, load_tokenizer

__all__ = [
    "Engine",
    "Generation",
    "Generator",
    "HFGenerator",
    "Sampler",
    "SamplingParams",
    "derive_seed",
    "encode_chat",
    "encode_messages",
    "generate_checked",
    "load_model",
    "load_pretrained",
    "load_tokenizer",
    "render_chat",
    "response_text",
]

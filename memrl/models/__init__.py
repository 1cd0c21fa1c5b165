"""Models by name: tiny random Qwen2 checkpoints built locally (tests, the offline quickstart)
and real pretrained models converted from pip-installed files (`memrl init-model`)."""

from memrl.models.pretrained import (
    MODEL_NAMES,
    PRETRAINED_MODELS,
    GGUFSource,
    convert_pretrained,
)
from memrl.models.tiny import build_tiny_model, build_tiny_tokenizer, count_parameters

__all__ = [
    "MODEL_NAMES",
    "PRETRAINED_MODELS",
    "GGUFSource",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "convert_pretrained",
    "count_parameters",
]

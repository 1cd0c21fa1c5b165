"""Models built locally: tiny random Qwen2 checkpoints for tests and the offline quickstart."""

from memrl.models.tiny import build_tiny_model, build_tiny_tokenizer, count_parameters

__all__ = ["build_tiny_model", "build_tiny_tokenizer", "count_parameters"]

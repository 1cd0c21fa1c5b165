"""Generators: everything that turns prompt token ids into response token ids."""

from memrl.inference.base import Generation, Generator, SamplingParams

__all__ = ["Generation", "Generator", "SamplingParams"]

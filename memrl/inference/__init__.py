"""Generators: everything that turns prompt token ids into response token ids."""

from memrl.inference.base import Generation, Generator, SamplingParams
from memrl.inference.hf import HFGenerator

__all__ = ["Generation", "Generator", "HFGenerator", "SamplingParams"]

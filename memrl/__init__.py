"""memrl: train and evaluate LLM memory agents with reinforcement learning."""

__version__ = "0.1.0"

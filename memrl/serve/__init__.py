"""`memrl serve`: a memory agent as an OpenAI-compatible chat endpoint (memrl[serve])."""

from memrl.serve.app import build_app, serve
from memrl.serve.batching import BatchingEngine
from memrl.serve.config import ServeConfig

__all__ = ["BatchingEngine", "ServeConfig", "build_app", "serve"]

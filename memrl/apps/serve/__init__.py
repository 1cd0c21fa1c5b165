"""`memrl serve`: a memory agent as an OpenAI-compatible chat endpoint (memrl[serve])."""

from memrl.apps.serve.app import build_app, serve
from memrl.apps.serve.batching import BatchingEngine
from memrl.recipes.reading import ServeConfig

__all__ = ["BatchingEngine", "ServeConfig", "build_app", "serve"]

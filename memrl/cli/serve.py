"""`memrl serve --model DIR`: the memory agent as an OpenAI-compatible chat endpoint."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from memrl.agents.memagent import MemAgentConfig
from memrl.cli.app import app
from memrl.cli.ask import AGENT_OPTIONS, model_agent_config
from memrl.cli import common
from memrl.apps.serve.config import ServeConfig

SERVE_OPTIONS = ["host", "port", "served_model_name", "max_request_bytes",
                 "max_document_tokens", "max_concurrent_requests", "header_timeout_s",
                 "body_timeout_s", "max_connections_per_client", "shutdown_timeout_s",
                 "api_key_env"]


@app.command("serve")
@common.engine_options([*common.LOCAL, "base_url"])
@common.config_options(MemAgentConfig, AGENT_OPTIONS, overrides=True)
@common.config_options(ServeConfig, SERVE_OPTIONS, name="server")
def serve(
    model: common.ModelOption,
    config: dict[str, Any],
    server: ServeConfig,
    serving: common.EngineChoice,
    log_level: Annotated[
        str, typer.Option(help="uvicorn's log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Answer OpenAI chat requests (/v1/chat/completions; /v1/models, /health) with the
    memory agent: the messages before the last user message are the documents, the last
    one is the question (docs/serving.md). Stops gracefully on SIGTERM or Ctrl-C."""
    from memrl.errors import require
    from memrl.apps.serve.app import serve as run_server
    from memrl.apps.serve.batching import BatchingEngine

    require("starlette", extra="serve", feature="memrl serve")
    require("uvicorn", extra="serve", feature="memrl serve")
    common.check_model_dir(model)
    agent = model_agent_config(model, config, "serve")
    api_key = os.environ.get(server.api_key_env) or None
    serving = common.reading_dtype(serving)
    generator = serving.load(model, seed=agent.seed)
    if not getattr(generator, "continuous_batching", False):
        generator = BatchingEngine(generator)
    name = server.served_model_name or model.resolve().name
    key_note = (f"API key required (from ${server.api_key_env})" if api_key
                else f"no API key (set ${server.api_key_env} to require one)")
    typer.echo(f"serving {model} as {name!r} at http://{server.host}:{server.port}/v1 "
               f"(engine {serving.engine}; chunk {agent.chunk_size} tokens, memory "
               f"{agent.max_memory_tokens} tokens; {key_note})", err=True)
    run_server(generator, model_name=name, agent=agent, config=server, api_key=api_key,
               log_level=log_level)

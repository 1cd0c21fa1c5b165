"""`memrl serve --model DIR`: the memory agent as an OpenAI-compatible chat endpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.agents.memagent import MemAgentConfig
from memrl.cli.app import app
from memrl.cli.ask import AGENT_OPTIONS, model_agent_config
from memrl.cli.common import (
    BaseUrlOption,
    GenerationBatchSizeOption,
    DeviceOption,
    DtypeOption,
    EngineOption,
    check_model_dir,
    config_options,
    load_engine,
)
from memrl.serve.config import ServeConfig

SERVE_OPTIONS = ["host", "port", "served_model_name", "max_request_bytes",
                 "max_document_tokens", "max_concurrent_requests", "api_key_env"]


@app.command("serve")
@config_options(MemAgentConfig, AGENT_OPTIONS, overrides=True)
@config_options(ServeConfig, SERVE_OPTIONS, name="server")
def serve(
    model: Annotated[Path, typer.Option("--model", help="Model directory (HF format).")],
    config: dict[str, Any],
    server: ServeConfig,
    generation_batch_size: GenerationBatchSizeOption = 32,
    engine: EngineOption = "hf",
    base_url: BaseUrlOption = None,
    device: DeviceOption = None,
    dtype: DtypeOption = None,
    log_level: Annotated[
        str, typer.Option(help="uvicorn's log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Answer OpenAI chat requests (/v1/chat/completions; /v1/models, /health) with the
    memory agent: the messages before the last user message are the documents, the last
    one is the question (docs/serving.md). Stops gracefully on SIGTERM or Ctrl-C."""
    from memrl.errors import require
    from memrl.serve.app import serve as run_server
    from memrl.serve.batching import BatchingEngine

    require("starlette", extra="serve", feature="memrl serve")
    require("uvicorn", extra="serve", feature="memrl serve")
    check_model_dir(model)
    agent = model_agent_config(model, config, "serve")
    api_key = os.environ.get(server.api_key_env) or None
    generator = load_engine(
        model, device=device, dtype=dtype, generation_batch_size=generation_batch_size,
        seed=agent.seed, engine=engine, base_urls=base_url,
    )
    if not getattr(generator, "continuous_batching", False):
        generator = BatchingEngine(generator)
    name = server.served_model_name or model.resolve().name
    key_note = (f"API key required (from ${server.api_key_env})" if api_key
                else f"no API key (set ${server.api_key_env} to require one)")
    typer.echo(f"serving {model} as {name!r} at http://{server.host}:{server.port}/v1 "
               f"(engine {engine}; chunk {agent.chunk_size} tokens, memory "
               f"{agent.max_memory_tokens} tokens; {key_note})", err=True)
    run_server(generator, model_name=name, agent=agent, config=server, api_key=api_key,
               log_level=log_level)

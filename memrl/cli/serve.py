"""`memrl serve --model DIR [CONFIG] [key.path=value ...]`: the memory agent as an
OpenAI-compatible chat endpoint (the config: `memrl.recipes.reading.ServeCommandConfig`)."""

from __future__ import annotations

import os

import typer

from memrl.cli.app import app
from memrl.cli import common
from memrl.cli.ask import CONFIG_HELP, CONFIG_METAVAR


@app.command("serve")
def serve(
    model: common.ModelOption,
    args: list[str] = typer.Argument(None, help=CONFIG_HELP.replace(
        "rollout.engine=vllm", "serve.port=8080"), metavar=CONFIG_METAVAR),
) -> None:
    """Answer OpenAI chat requests (/v1/chat/completions; /v1/models, /health) with the
    memory agent: the messages before the last user message are the documents, the last
    one is the question (docs/serving.md). Stops gracefully on SIGTERM or Ctrl-C.

    Every setting is a key (docs/configuration.md, `memrl serve`): `serve.*` (host, port,
    served_model_name, api_key_env, the limits, log_level, threads), the agent's
    `memagent.*`, `model.dtype`, `model.device`, `seed` and the engine `rollout.*`. The
    agent settings are those stored with a model memrl trained, unless given. The API key
    is read from the variable `serve.api_key_env` names (default MEMRL_API_KEY)."""
    from memrl.apps.ask.settings import load_reading_config
    from memrl.apps.serve.app import serve as run_server
    from memrl.apps.serve.batching import BatchingEngine
    from memrl.errors import require
    from memrl.recipes.reading import ServeCommandConfig, reading_agent, reading_engine

    require("starlette", extra="serve", feature="memrl serve")
    require("uvicorn", extra="serve", feature="memrl serve")
    common.check_model_dir(model)
    cfg = load_reading_config(ServeCommandConfig, model, args, command="serve",
                              warn=common.print_warning)
    server, agent = cfg.serve, reading_agent(cfg)
    api_key = os.environ.get(server.api_key_env) or None
    generator = reading_engine(cfg)
    if not getattr(generator, "continuous_batching", False):
        generator = BatchingEngine(generator)
    name = server.served_model_name or model.resolve().name
    key_note = (f"API key required (from ${server.api_key_env})" if api_key
                else f"no API key (set ${server.api_key_env} to require one)")
    typer.echo(f"serving {model} as {name!r} at http://{server.host}:{server.port}/v1 "
               f"(engine {cfg.rollout.engine}; chunk {agent.chunk_size} tokens, memory "
               f"{agent.max_memory_tokens} tokens; {key_note})", err=True)
    run_server(generator, model_name=name, agent=agent, config=server, api_key=api_key,
               log_level=server.log_level)

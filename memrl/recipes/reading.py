"""The configs of `memrl ask` and `memrl serve` (`[CONFIG] [key.path=value ...]` after their
paths), and the engine and agent settings they give.

Both read with MemAgent and share training's names for what they share with it: `model.*`
(`model.path` is `--model`), `seed`, the agent's section `memagent.*` and the engine under
`rollout.*` (the sections of `memrl eval`'s `EvalConfig`, run by its `load_engine`). What only
one of them has is in its own section: `ask.*` (what is printed, the trace) and
`serve.*` (where it listens, its limits, the API key's variable; the key itself is read from
the environment, never from a config).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from memrl.config import StrictModel, located_error
from memrl.recipes.config import AgentSection
from memrl.recipes.evaluate import EvalModelConfig, EvalRolloutConfig


class ReadingRolloutConfig(EvalRolloutConfig):
    """`memrl eval`'s `rollout` section, with prompt-lookup decoding on (the reader's memory
    updates copy text from the prompt; set `rollout.prompt_lookup_tokens=0` to turn it off)."""

    prompt_lookup_tokens: int = Field(10, ge=0)
    """hf engine, greedy requests (temperature 0; a batch of one): draft up to this many
    tokens by prompt lookup and check them in one forward pass (same answers, fewer forward
    passes: `RolloutConfig.prompt_lookup_tokens`). 0: off."""


class ReadingConfig(AgentSection):
    """What `memrl ask` and `memrl serve` share: the model, the engine, the seed and the
    agent's section (over the settings stored with the model)."""

    agent: Literal["memagent"] = "memagent"
    """The agent that reads: MemAgent (chunk by chunk into a fixed-size memory)."""
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    """Seed of the sampling (and of torch on the hf engine); the agent section's `seed`,
    where given, wins. None: not seeded (greedy decoding needs none)."""
    model: EvalModelConfig
    rollout: ReadingRolloutConfig = ReadingRolloutConfig()
    """Training's `rollout` section: the engine (hf in-process, vllm colocated, openai servers,
    read from and never sent weights) and sampling (`rollout.temperature` / `rollout.top_p`,
    when given, over the agent section's)."""

    @model_validator(mode="before")
    @classmethod
    def _reads_with_memagent(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("agent", "memagent") != "memagent":
            raise located_error(cls.__name__, "agent", "memrl ask and memrl serve read with "
                                "MemAgent: agent memagent (or leave it out)", data["agent"])
        return data


class AskSection(StrictModel):
    """What only `memrl ask` has: what it prints and writes."""

    show_memory: bool = False
    """Print the memory after each chunk (on standard output)."""
    trace: str | None = None
    """Write the episode to this JSONL file (open it with `memrl view FILE`)."""
    quiet: bool = False
    """No progress bar and no summary: only the answer."""


class AskModelConfig(EvalModelConfig):
    """`memrl eval`'s `model` section, on one torch thread unless `model.threads` says
    otherwise."""

    threads: int | None = Field(1, ge=1)
    """torch's CPU threads for the hf engine; None: torch's (one per core). Reading one
    document decodes its memory a few tokens at a time, which a second thread barely speeds
    up, and on a CPU busy with other work every step waits for the thread whose core is taken
    (docs/lab/benchmarks.md). (`memrl serve` keeps torch's default, one a core.)"""


class AskConfig(ReadingConfig):
    """`memrl ask --model DIR --document FILE ... --question Q [CONFIG] [key.path=value ...]`."""

    model: AskModelConfig

    ask: AskSection = AskSection()


class ServeConfig(StrictModel):
    """What only `memrl serve` has: where it listens, what it accepts, who may call it."""

    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0: every interface; then set an API key)."""
    port: int = Field(8000, ge=0, le=65535)
    """Port to listen on (0: any free port, printed at start)."""
    served_model_name: str | None = None
    """The model's name in /v1/models and in requests' `model`; None: the model
    directory's name."""
    max_request_bytes: int = Field(32 << 20, ge=1)
    """Largest request body in bytes (a larger one is refused with 413). 32 MiB holds a
    million-token document of English text a few times over."""
    max_document_tokens: int = Field(2_000_000, ge=1)
    """Most tokens the documents of one request may have together (more: 413)."""
    max_concurrent_requests: int = Field(64, ge=1)
    """Chat requests worked on at once; one more is refused with 429 (retry later)."""
    header_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    """Seconds a request's head (request line and headers) may take to arrive, from the
    connection's start or the previous response; later: 408 and the connection closed."""
    body_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    """Seconds a chat request's body may take to arrive whole once its head has; later: 408
    and the connection closed. A request takes a slot of max_concurrent_requests only once
    its body is read, so a stalled body holds none. Raise it for large documents sent over
    slow links."""
    max_connections_per_client: int = Field(64, ge=1)
    """Open connections one client address may hold; one more is answered 429 and closed.
    Behind a proxy every client has the proxy's address: raise it there."""
    shutdown_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    """On SIGTERM / Ctrl-C, seconds the requests in flight get to finish; those still
    running then are cancelled (503, or their stream ended) and the server exits."""
    api_key_env: str = "MEMRL_API_KEY"
    """Environment variable holding the API key. When it is set (and not empty), every
    /v1 request must send `Authorization: Bearer <key>`; /health stays open."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """uvicorn's log level."""


class ServeCommandConfig(ReadingConfig):
    """`memrl serve --model DIR [CONFIG] [key.path=value ...]`."""

    serve: ServeConfig = ServeConfig()


def reading_agent(cfg: ReadingConfig) -> Any:
    """The agent section of `cfg`, sampling as `rollout.temperature` / `rollout.top_p` say
    where given, seeded by `seed` where the section gives no seed of its own."""
    from memrl.recipes.evaluate import eval_seed, sampling_as_rollout

    return sampling_as_rollout(cfg).agent_config.model_copy(update={"seed": eval_seed(cfg)})


def reading_engine(cfg: ReadingConfig) -> Any:
    """The engine of `rollout.engine` for `model.path` (`memrl.recipes.evaluate.load_engine`:
    `model.threads` torch threads on the hf engine). Without `model.dtype`, the dtype this
    machine reads fastest in: on a CPU with bfloat16 instructions bfloat16, else float32
    (`memrl.inference.loader.cpu_compute_dtype`; evaluations keep float32 on every CPU)."""
    from memrl.recipes.evaluate import load_engine

    if cfg.rollout.engine == "hf":
        from memrl.errors import MemrlInputError
        from memrl.inference.loader import resolve_device, resolve_dtype

        try:
            device = resolve_device(cfg.model.device)
        except MemrlInputError as exc:
            raise MemrlInputError(exc.message, location="model.device") from None
        if cfg.model.dtype is None:
            fast = resolve_dtype("fast", device)
            model = cfg.model.model_copy(update={"dtype": str(fast).removeprefix("torch.")})
            cfg = cfg.model_copy(update={"model": model})
    return load_engine(cfg)

"""Pieces every evaluation command shares: checked inputs, config from options, a generator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from memrl.errors import MemrlInputError
from memrl.inference.config import DEFAULT_HEALTH_CHECK_S, DEFAULT_REQUEST_TIMEOUT_S


def config_from_options(model: type[BaseModel], **fields: Any) -> Any:
    """Build an agent config from CLI values; a bad value is a one-line error naming its option."""
    try:
        return model(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        option = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "config"
        raise MemrlInputError(err["msg"], location=option) from exc


def check_model_dir(model: Path) -> None:
    """A local Hugging Face model directory, checked before anything heavy is loaded: its
    config, weights (headers) and tokenizer files (see `memrl.modelfiles`)."""
    if not model.is_dir():
        raise MemrlInputError("model directory not found", location=f"--model {model}")
    if not (model / "config.json").is_file():
        raise MemrlInputError(
            "not a Hugging Face model directory (no config.json)", location=f"--model {model}"
        )
    from memrl.modelfiles import check_model_dir as check_files, check_tokenizer_dir

    check_files(model)
    check_tokenizer_dir(model)


def load_engine(
    model: Path,
    *,
    device: str | None,
    dtype: str | None,
    generation_batch_size: int,
    seed: int | None,
    engine: str = "hf",
    base_urls: list[str] | None = None,
    gpu_memory_utilization: float | None = None,
    request_timeout: float | None = None,
    health_check: float | None = None,
) -> Any:
    """The generator of `engine` for `model`: HFEngine on `device` (validated, torch
    seeded when asked), a vLLM engine, or a pool of OpenAI-compatible servers (each request
    given `request_timeout` seconds, the servers checked every `health_check` seconds; the
    servers asked at once whether they answer: none answering is a one-line error naming the
    URLs)."""
    import torch

    from memrl.inference.config import ENGINES
    from memrl.inference.factory import build_engine
    from memrl.inference.loader import load_pretrained, load_tokenizer, resolve_device

    if engine not in ENGINES:
        raise MemrlInputError(f"choose one of {', '.join(ENGINES)}", location=f"--engine {engine}")
    if base_urls and engine != "openai":  # (it was ignored: the model ran on `engine`)
        raise MemrlInputError(f"servers are read by --engine openai, not {engine}: add "
                              "--engine openai, or drop --base-url", location="--base-url")
    if engine == "openai":
        from memrl.inference.config import OpenAIConfig

        if not base_urls:
            raise MemrlInputError(
                "--engine openai needs at least one --base-url", location="--engine"
            )
        options = {"timeout_s": ("--request-timeout", request_timeout),
                   "health_check_s": ("--health-check", health_check)}
        try:
            config = OpenAIConfig(base_urls=base_urls, **{
                key: value for key, (_, value) in options.items() if value is not None})
        except ValidationError as exc:
            option, value = options.get(str(exc.errors()[0]["loc"][0]), ("--base-url", None))
            raise MemrlInputError(f"must be a finite number of seconds > 0, got {value}",
                                  location=option) from None
        generator = build_engine("openai", load_tokenizer(model), openai=config,
                                 location="--base-url")
        generator.name_or_path = str(model)
        return generator
    if engine == "vllm":
        from memrl.inference.config import VLLMConfig

        share = {} if gpu_memory_utilization is None else {
            "gpu_memory_utilization": gpu_memory_utilization}
        try:
            vllm = VLLMConfig(dtype=dtype or "auto", seed=seed or 0, **share)
        except ValueError as exc:
            if "gpu_memory_utilization" in str(exc):
                raise MemrlInputError("must be in (0, 1]", location=(
                    f"--gpu-memory-utilization {gpu_memory_utilization}")) from None
            raise MemrlInputError(
                "vLLM takes auto, float32, bfloat16 or float16", location=f"--dtype {dtype}"
            ) from None
        return build_engine("vllm", load_tokenizer(model), model_path=model, vllm=vllm)
    try:
        device = resolve_device(device)
    except MemrlInputError as exc:
        raise MemrlInputError(exc.message, location="--device") from None
    if seed is not None:
        torch.manual_seed(seed)
    model_, tokenizer = load_pretrained(str(model), device=device, dtype=dtype)
    generator = build_engine("hf", tokenizer, model=model_,
                             generation_batch_size=generation_batch_size)
    generator.name_or_path = str(model)
    return generator


@contextlib.contextmanager
def eval_interruptible(out: Path) -> Iterator[None]:
    """Ctrl-C / SIGTERM during an evaluation: one line naming `out`, exit 130 / 143. A failure
    of the machinery (every server of the pool lost): one line saying what failed, that the
    finished episodes are kept in `out` and the command that continues, exit 1."""
    from memrl.cli import command_line
    from memrl.errors import InfrastructureError
    from memrl.interrupt import exit_on_signals

    with exit_on_signals(
        f"while evaluating into {out}",
        "finished episodes are kept there; run the same command again to continue",
    ):
        try:
            yield
        except InfrastructureError as exc:
            raise InfrastructureError(
                f"{exc}; finished episodes are kept in {out}; continue with: "
                f"{command_line('--resume')}"
            ) from exc


def record_eval(out: Path, kind: str, *, engine: str, device: str | None, seed: int | None,
                settings: dict[str, Any]) -> Any:
    """The run record (`memrl.run.record`) of an evaluation into `out`; `settings` (the
    command's options and agent config) is what the config hash covers."""
    from memrl.run.record import recorded

    return recorded(out, kind, config=settings, seed=seed, engine=engine, device=device)


def print_warning(message: str) -> None:
    """`warning: <message>` as one scrubbed line on stderr (the run goes on)."""
    import sys

    from memrl.cli import one_line
    from memrl.run.metrics import scrub_env_secrets

    print(f"warning: {scrub_env_secrets(one_line(message))}", file=sys.stderr, flush=True)


class EngineChoice(BaseModel):
    """Where `memrl eval` runs its model (engine, device, dtype, data-parallel processes),
    for its ranks and its run record."""

    model_config = ConfigDict(extra="forbid")

    generation_batch_size: int = Field(32, ge=1, description=(
        "Prompts per forward pass of the hf engine (a micro-batch; "
        "rollout.generation_batch_size in training)."))
    engine: str = Field("hf", description=(
        "Generation engine: hf (in-process), vllm, openai (servers)."))
    base_url: list[str] | None = Field(None, description=(
        "A vLLM OpenAI-compatible server (--engine openai); repeat for several."))
    request_timeout: float = Field(DEFAULT_REQUEST_TIMEOUT_S, description=(
        "Seconds one server request may take before it is retried on another server "
        "(--engine openai; rollout.openai.timeout_s)."))
    health_check: float = Field(DEFAULT_HEALTH_CHECK_S, description=(
        "How often (seconds) the pool checks on its servers, and how long a server's "
        "/health may take (--engine openai; rollout.openai.health_check_s)."))
    device: str | None = Field(None, description="torch device, e.g. cuda, cpu.")
    dtype: str | None = Field(None, description=(
        "Model dtype, e.g. bfloat16; default: bfloat16 on CUDA, float32 on a CPU (memrl ask "
        "and serve: bfloat16 on a CPU with bfloat16 instructions)."))
    threads: int | None = Field(None, ge=1, description=(
        "torch's CPU threads for the hf engine; none: torch's (one per core). 1 is far "
        "faster on a CPU busy with other work."))
    gpu_memory_utilization: float | None = Field(None, description=(
        "--engine vllm on a GPU: share of its memory the engine may take "
        "(verl rollout.gpu_memory_utilization; default 0.5)."))
    data_parallel: int = Field(1, ge=1, description=(
        "Evaluate on N processes of this machine, one engine each (one GPU each on CUDA), "
        "the episodes shared out, one results directory: memrl starts torchrun on itself."))

    _loaded: list[Any] = PrivateAttr(default_factory=list)

    def load(self, model: Path, *, seed: int | None) -> Any:
        """The engine for `model` (`load_engine`); `close_engines` shuts it down."""
        if self.threads is not None and self.engine == "hf":
            import torch

            torch.set_num_threads(self.threads)
        engine = load_engine(
            model, device=self.device, dtype=self.dtype,
            generation_batch_size=self.generation_batch_size, seed=seed, engine=self.engine,
            base_urls=self.base_url, gpu_memory_utilization=self.gpu_memory_utilization,
            request_timeout=self.request_timeout, health_check=self.health_check)
        self._loaded.append(engine)
        return engine

    def keep(self, engine: Any) -> Any:
        """`engine`, shut down by `close_engines` with those `load` built (after the ranks'
        last barrier: vLLM's shutdown takes the process group down with it)."""
        self._loaded.append(engine)
        return engine

    def close_engines(self) -> None:
        """Shut down the engines `load` built that have a `close` (vLLM's must go before the
        process group does: at interpreter exit its own groups can no longer be destroyed)."""
        while self._loaded:
            close = getattr(self._loaded.pop(), "close", None)
            if close is not None:
                close()


EVAL_DIST_TIMEOUT_S = 3600.0
"""How long a rank of a data-parallel evaluation waits for the others at a meeting point (the
end of a benchmark's episodes, at most one slice of imbalance) before it fails."""


@contextlib.contextmanager
def evaluation_ranks(serving: EngineChoice) -> Iterator[Any]:
    """The ranks of a data-parallel evaluation, as a `Dist`: `eval.data_parallel=N` (N > 1)
    starts this command again on N processes under torchrun and ends with their exit code;
    under torchrun (memrl's, or the user's own) this process joins the group (its GPU:
    cuda:LOCAL_RANK); otherwise `Dist()`, one process."""
    from memrl.cli import _invocation
    from memrl.distributed import Dist, destroy_process_group, init_process_group, launched
    from memrl.distributed import relaunch

    if not launched():
        if serving.data_parallel > 1:
            if serving.engine == "openai":
                raise MemrlInputError(
                    "runs an engine per process: with rollout.engine=openai the server pool "
                    "already spreads the episodes (give more rollout.openai.base_urls)",
                    location="eval.data_parallel")
            check_gpus_for(serving.data_parallel, serving.device)
            raise typer.Exit(relaunch(serving.data_parallel, list(_invocation)))
        yield Dist()
        return
    dist = init_process_group(EVAL_DIST_TIMEOUT_S, device=serving.device, always=True)
    try:
        yield dist
        dist.barrier()  # every rank done before any leaves the group (after an error: not)
    finally:
        serving.close_engines()
        destroy_process_group()


def check_gpus_for(processes: int, device: str | None) -> None:
    """On a CUDA machine (device unset or cuda), one GPU per process: refuse more processes
    than GPUs before any starts."""
    import torch

    if torch.cuda.is_available() and (device is None or device.startswith("cuda")):
        gpus = torch.cuda.device_count()
        if processes > gpus:
            raise MemrlInputError(f"{processes} processes, one GPU each, but this machine has "
                                  f"{gpus} (or model.device=cpu)", location="eval.data_parallel")


# Options several commands take, declared once.
ModelOption = Annotated[Path, typer.Option("--model", help="Model directory (HF format).")]

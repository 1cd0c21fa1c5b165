"""A pool of running vLLM OpenAI-compatible servers as one Engine.

`OpenAIGenerator` sends each prompt, as token ids, to `/v1/completions` of one of the
servers (`logprobs=0` and `return_tokens_as_token_ids`: the response comes back as token ids
with the log-prob of each), so agents see exactly what the in-process engines give them:

- Spreading: a request goes to the live server with the fewest requests in flight; each
  server takes at most `max_in_flight_per_server` at once (the others wait for a slot).
- Failures: a request that fails (connection refused or reset, timeout, HTTP 5xx) is retried
  up to `max_retries` times, on another server when there is one; a server that refuses
  connections is marked down and gets no new request while any other is up. A dead server
  so costs only the requests it held. A 4xx answer (a bad request) is not retried.
- Conventions: the HF engine's (`memrl.inference.hf`): the response's token ids include EOS
  when the model stopped, a stop string ends a response after the token that completes it,
  `text` is decoded here by the tokenizer and cut just after the stop string. Start servers
  with `--logprobs-mode processed_logprobs` for log-probs under the sampling temperature
  (vLLM's default, raw_logprobs, is temperature 1). Seeds as in the vLLM engine: each
  request is sent with its own `params.seed` (one SamplingParams for a whole `generate` call
  gives prompt i `derive_seed(params.seed, i)`), so `agenerate(prompt, params)` equals
  `generate([prompt], [params])[0]`.
- Weights (training): `sync_weights` writes the policy's weights to `weights_dir` and has
  every server reload them (`/collective_rpc` → `reload_weights`, then
  `/reset_prefix_cache`; servers started with VLLM_SERVER_DEV_MODE=1). A disk round trip:
  the servers may be other processes or machines sharing that directory.

Only the standard library talks HTTP (urllib in a thread pool): no extra dependency.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError
from memrl.inference.base import Generation, SamplingParams, check_prompts, request_params
from memrl.inference.config import OpenAIConfig
from memrl.inference.hf import first_stop_end
from memrl.inference.vllm import policy_weights

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM writes a token with `return_tokens_as_token_ids`: "token_id:123"."""


def token_id(token: object) -> int | None:
    """The id in "token_id:123" (vLLM's `return_tokens_as_token_ids`), else None."""
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        return None
    digits = token[len(TOKEN_ID_PREFIX):]
    return int(digits) if digits.isascii() and digits.isdigit() else None


class ServerError(RuntimeError):
    """A request a server could not answer (after every retry)."""


class _Retryable(Exception):
    """A failure another server (or a later try) may not have."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass
class Server:
    """One listed base URL: its slots and its health."""

    url: str
    slots: asyncio.Semaphore | None = None
    in_flight: int = 0
    down: bool = False
    requests: int = 0
    failures: int = 0


class OpenAIGenerator:
    """Batched and async generation over several OpenAI-compatible vLLM servers."""

    continuous_batching = True
    """Concurrent requests are in flight together; each server batches them continuously."""

    def __init__(self, config: OpenAIConfig, tokenizer: Any) -> None:
        if not config.base_urls:
            raise MemrlInputError("no server URL given", location="rollout.openai.base_urls")
        for url in config.base_urls:
            if not url.startswith(("http://", "https://")):
                raise MemrlInputError(
                    "a server URL starts with http:// or https://", location=f"base_url {url}"
                )
        self.config = config
        self.tokenizer = tokenizer
        self.servers = [Server(url.rstrip("/")) for url in config.base_urls]
        self.model = config.model
        workers = config.max_in_flight_per_server * len(self.servers)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memrl-http")
        self._loop: asyncio.AbstractEventLoop | None = None
        self.synced_step: int | None = None

    # ---- generation
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """One Generation per prompt, in input order; requests run concurrently."""
        check_prompts(prompts)
        if not prompts:
            return []
        each = request_params(prompts, params)

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
            self.model = await self._served_model()
        body = self.request_body(prompt, params)
        tried: list[Server] = []
        errors: list[str] = []
        for _ in range(self.config.max_retries + 1):
            server = self._pick(tried)
            if server is None:
                break
            tried.append(server)
            assert server.slots is not None
            async with server.slots:
                server.in_flight += 1
                server.requests += 1
                try:
                    data = await self._call(server, "/v1/completions", body)
                except _Retryable as exc:
                    server.failures += 1
                    server.down = server.down or exc.refused
                    errors.append(f"{server.url}: {exc}")
                    continue
                finally:
                    server.in_flight -= 1
            return self.to_generation(data, params)
        raise ServerError(
            f"request failed on {len(tried)} attempt(s): "
            + "; ".join(errors[-3:] or ["no server up"])
        )

    def _bind_loop(self) -> None:
        """Semaphores belong to one event loop: make them for the running one."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            for s in self.servers:
                s.slots = asyncio.Semaphore(self.config.max_in_flight_per_server)

    def _pick(self, tried: list[Server]) -> Server | None:
        """The least busy server that is up, preferring one this request has not tried."""
        up = [s for s in self.servers if not s.down]
        if not up:
            return None
        fresh = [s for s in up if all(s is not t for t in tried)]
        candidates = fresh or up
        return min(candidates, key=lambda s: (s.in_flight, s.requests))

    async def _served_model(self) -> str:
        for server in self.servers:
            if server.down:
                continue
            try:
                data = await self._call(server, "/v1/models", None)
            except _Retryable:
                server.down = True
                continue
            return str(data["data"][0]["id"])
        raise ServerError("no server answered /v1/models: " +
                          ", ".join(s.url for s in self.servers))

    async def _call(self, server: Server, path: str, body: dict | None) -> dict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._http, server.url + path, body)

    def _http(self, url: str, body: dict | None) -> dict:
        """One blocking HTTP call (in a worker thread): JSON in, JSON out."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url, data=data, headers={"Content-Type": "application/json"},
            method="GET" if body is None else "POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            if exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}: {detail}") from None
            raise ServerError(f"{url}: HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            refused = isinstance(exc.reason, ConnectionRefusedError)
            raise _Retryable(f"{exc.reason}", refused=refused) from None
        except (TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}",
                             refused=isinstance(exc, ConnectionRefusedError)) from None

    def to_generation(self, data: dict, params: SamplingParams) -> Generation:
        """A `/v1/completions` answer as a Generation with the HF engine's conventions."""
        choice = data["choices"][0]
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
        """Make every server that is up serve `policy`'s current weights: write them (HF
        names, LoRA merged, tied `lm_head.weight` included) as safetensors under
        `weights_dir`, then ask each server to `reload_weights` from there and to reset its
        prefix cache. Without `weights_dir` the servers keep their weights: refused."""
        if policy is None:
            return
        if self.config.weights_dir is None:
            raise MemrlInputError(
                "training on servers needs rollout.openai.weights_dir (a directory the "
                "servers can read) to send them new weights every step",
                location="rollout.openai.weights_dir",
            )
        path = Path(self.config.weights_dir) / f"step_{step:06d}"
        save_policy_weights(policy, path)
        for url in dict.fromkeys(s.url for s in self.servers if not s.down):
            try:
                self._http(url + "/collective_rpc", {
                    "method": "reload_weights", "kwargs": {"weights_path": str(path)},
                })
                self._http(url + "/reset_prefix_cache", {})
            except _Retryable as exc:  # a dead server gets no more requests
                for s in self.servers:
                    s.down = s.down or s.url == url
                if all(s.down for s in self.servers):
                    raise ServerError(f"no server took the new weights: {exc}") from None
        for old in Path(self.config.weights_dir).glob("step_*"):
            if old != path and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        self.synced_step = step

    def sleep(self) -> None:
        """Nothing to free here: the servers manage their own memory."""

    def wake(self) -> None:
        """Nothing to restore (see `sleep`)."""

    def close(self) -> None:
        """Nothing to release: the servers run on."""

    def stats(self) -> dict[str, dict[str, Any]]:
        """Requests, failures and health of each server (by URL, listed order)."""
        out: dict[str, dict[str, Any]] = {}
        for s in self.servers:
            row = out.setdefault(s.url, {"requests": 0, "failures": 0, "down": s.down})
            row["requests"] += s.requests
            row["failures"] += s.failures
        return out


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


def wait_until_ready(base_url: str, timeout_s: float = 120.0) -> None:
    """Block until `base_url`/health answers 200 (a server just started), or raise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise ServerError(f"{base_url} not ready after {timeout_s:.0f} s")

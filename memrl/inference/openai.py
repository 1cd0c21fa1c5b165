"""A pool of running vLLM OpenAI-compatible servers as one Engine.

`OpenAIGenerator` sends each prompt, as token ids, to `/v1/completions` of one of the
servers (`logprobs=0` and `return_tokens_as_token_ids`: the response comes back as token ids
with the log-prob of each), so agents see exactly what the in-process engines give them:

- Spreading: a request goes to the live server with the fewest requests in flight that has
  a free slot; each server takes at most `max_in_flight_per_server` at once (a URL listed k
  times: k times that), the others wait for a slot.
- Failures: a request that fails on a live server (reset, no answer within `timeout_s`,
  HTTP 5xx) is retried up to `max_retries` times, on another server when there is one. A 4xx
  answer (a bad request) is not retried.
- Health: a server is *lost* when it refuses connections, or when it holds requests, has
  answered nothing for the stall bound (`stall_bound`: 4 × the slowest of the last 64
  replies, at least `health_check_s`, at most `timeout_s`; `timeout_s` before any reply) and
  its `/health` does not answer within `health_check_s` (a frozen process). Its requests
  are taken back at once (their sockets closed) and sent to live servers without using up
  a retry. A lost server gets no request; it is probed every `health_check_s` and comes
  back when `/health` answers (in training after reloading the current weights). Each loss
  and each return is one line on stderr; while requests wait, a progress line every
  `progress_s` says what the pool is doing, so a stall is visible. So a frozen server costs
  at most the stall bound + 2 × `health_check_s` (+ 1 s of the watch's tick).
- No live server left: `PoolLostError` (the CLI prints one line, with the command that
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

Only the standard library talks HTTP (http.client in a thread pool): no extra dependency.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.errors import InfrastructureError, MemrlInputError
from memrl.inference.base import Generation, SamplingParams, check_prompts, request_params
from memrl.inference.config import OpenAIConfig
from memrl.inference.hf import first_stop_end
from memrl.inference.vllm import policy_weights

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM writes a token with `return_tokens_as_token_ids`: "token_id:123"."""

STALL_FACTOR = 4.0
"""A busy server silent for this many times the slowest recent reply is probed."""
RECENT_REPLIES = 64
"""How many of the latest reply times `stall_bound` looks at."""
WATCH_TICK_S = 1.0
"""How often the watch looks at the servers (at most; `health_check_s` when smaller)."""
LOGPROBS_MODE = "processed_logprobs"
"""The servers' `--logprobs-mode` that gives log-probs under the sampling temperature."""


def token_id(token: object) -> int | None:
    """The id in "token_id:123" (vLLM's `return_tokens_as_token_ids`), else None."""
    if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
        return None
    digits = token[len(TOKEN_ID_PREFIX):]
    return int(digits) if digits.isascii() and digits.isdigit() else None


class ServerError(InfrastructureError):
    """A request the servers could not answer (after every retry), or an answer that is not
    vLLM's."""


class PoolLostError(ServerError):
    """No live server is left in the pool."""


class _Retryable(Exception):
    """A failure another server (or a later try) may not have."""

    def __init__(self, message: str, *, unreachable: bool = False, moved: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        """The server could not be connected to (refused, no route): it is lost."""
        self.moved = moved
        """The pool took the request back from a lost server: not the request's failure."""


class _Call:
    """One HTTP exchange in a worker thread that another thread can end at once (`abort`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self.aborted = False

    def attach(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conn = conn
        self.check()

    def check(self) -> None:
        if self.aborted:
            raise _Retryable("taken back from a lost server", moved=True)

    def abort(self) -> None:
        """Close the socket under the worker thread's feet: its blocked read returns."""
        with self._lock:
            self.aborted = True
            conn = self._conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def http_json(url: str, body: dict | None, *, timeout: float, call: _Call | None = None) -> Any:
    """One blocking HTTP exchange (in a worker thread): JSON in (POST; GET without `body`),
    JSON out. Raises `_Retryable` for what another try may not meet (no connection, a reset,
    no answer within `timeout`, HTTP 5xx, a cut answer) and `ServerError` for a 4xx."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    call = call or _Call()
    conn = cls(parts.hostname or "", parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        call.attach(conn)
        try:
            conn.connect()
        except TimeoutError:
            raise _Retryable(f"no connection within {timeout:g} s", unreachable=True) from None
        except OSError as exc:
            raise _Retryable(_reason(exc), unreachable=True) from None
        call.check()
        data = None if body is None else json.dumps(body).encode()
        try:
            conn.request("GET" if body is None else "POST", target, body=data,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
        except TimeoutError:
            call.check()
            raise _Retryable(f"no answer within {timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            call.check()
            raise _Retryable(_reason(exc)) from None
    finally:
        conn.close()
    if response.status >= 500:
        raise _Retryable(f"HTTP {response.status}: {_text(payload)}")
    if response.status >= 400:
        raise ServerError(f"{url}: HTTP {response.status}: {_text(payload)}")
    try:
        return json.loads(payload) if payload.strip() else {}
    except json.JSONDecodeError:
        raise _Retryable(f"an answer that is not JSON: {_text(payload)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(payload: bytes) -> str:
    return " ".join(payload.decode(errors="replace").split())[:300]


def say(text: str) -> None:
    """One line on stderr, at once (the pool's default `notify`)."""
    print(text, file=sys.stderr, flush=True)


@dataclass(eq=False)
class Server:
    """One server (a base URL, however often it is listed): its slots and its health."""

    url: str
    share: int = 1
    """How often the URL is listed: it takes `share` × max_in_flight_per_server requests."""
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    lost: str | None = None
    """Why the pool stopped sending it requests; None while it is live."""
    lost_at: float = 0.0
    last_reply: float = 0.0
    """time.monotonic() of its last answer (a reply or a /health)."""
    busy_since: float = 0.0
    """When it last went from no request in flight to one."""
    last_probe: float = 0.0
    probing: bool = False
    calls: set[_Call] = field(default_factory=set)

    @property
    def down(self) -> bool:
        return self.lost is not None


class OpenAIGenerator:
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
        if not config.base_urls:
            raise MemrlInputError("no server URL given", location="rollout.openai.base_urls")
        for url in config.base_urls:
            if not url.startswith(("http://", "https://")):
                raise MemrlInputError(
                    "a server URL starts with http:// or https://", location=f"base_url {url}"
                )
        self.config = config
        self.tokenizer = tokenizer
        self.notify = notify
        """Where the pool's lines go (a server lost or back, progress): stderr by default."""
        shares: dict[str, int] = {}
        for url in config.base_urls:
            shares[url.rstrip("/")] = shares.get(url.rstrip("/"), 0) + 1
        self.servers = [Server(url, share) for url, share in shares.items()]
        self.model = config.model
        workers = config.max_in_flight_per_server * len(config.base_urls)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memrl-http")
        self._probes = ThreadPoolExecutor(max_workers=2 * len(self.servers),
                                          thread_name_prefix="memrl-probe")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._lookup: asyncio.Lock | None = None
        self._watch: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._active = 0
        self._replies = 0
        self._durations: deque[float] = deque(maxlen=RECENT_REPLIES)
        self._weights: Path | None = None
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
            except (_Retryable, ServerError) as exc:
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
        except _Retryable:
            return  # lost meanwhile: the health check deals with it
        model_config = (info.get("vllm_config") or {}).get("model_config") if isinstance(
            info, dict) and isinstance(info.get("vllm_config"), dict) else None
        mode = (model_config or {}).get("logprobs_mode")
        if mode is not None and mode != LOGPROBS_MODE:
            raise MemrlInputError(
                f"{url} returns log-probs in vLLM's {mode} mode (temperature 1), which "
                "training compares with the trainer's at the sampling temperature: start it "
                f"with --logprobs-mode {LOGPROBS_MODE}",
                location=location,
            )

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
        self._active += 1
        try:
            if self.model is None:
                assert self._lookup is not None
                async with self._lookup:  # once, whoever comes first
                    if self.model is None:
                        await asyncio.to_thread(self.check_servers)
            body = self.request_body(prompt, params)
            tried: list[Server] = []
            errors: list[str] = []
            while True:
                server = await self._acquire(tried)
                tried.append(server)
                call = _Call()
                server.calls.add(call)
                started = time.monotonic()
                try:
                    data = await self._call(server, "/v1/completions", body, call)
                except _Retryable as exc:
                    if exc.unreachable:
                        self._lose(server, str(exc))
                    if not exc.moved:
                        server.failures += 1
                        errors.append(f"{server.url}: {exc}")
                    if len(errors) > self.config.max_retries or len(tried) > (
                            self.config.max_retries + 4 * len(self.servers)):
                        raise ServerError(f"request failed on {len(tried)} attempt(s): "
                                          + "; ".join(errors[-3:])) from None
                    continue
                finally:
                    server.calls.discard(call)
                    self._release(server)
                now = time.monotonic()
                server.last_reply = now
                self._durations.append(now - started)
                self._replies += 1
                return self.to_generation(data, params)
        finally:
            self._active -= 1

    def _bind_loop(self) -> None:
        """The pool's event and its watch belong to one event loop: make them for the
        running one (each `generate` runs its own)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._changed = asyncio.Event()
            self._lookup = asyncio.Lock()
            self._watch = None
        if self._watch is None or self._watch.done():
            self._watch = loop.create_task(self._watch_servers())

    async def _acquire(self, tried: list[Server]) -> Server:
        """A live server with a free slot (the least busy, one this request has not tried
        first), its slot taken; waits for one. No live server left: PoolLostError."""
        assert self._changed is not None
        while True:
            live = [s for s in self.servers if s.lost is None]
            if not live:
                raise PoolLostError(self.lost_summary())
            free = [s for s in live
                    if s.in_flight < s.share * self.config.max_in_flight_per_server]
            if free:
                server = min(free, key=lambda s: (any(s is t for t in tried),
                                                  s.in_flight / s.share, s.requests / s.share))
                if server.in_flight == 0:
                    server.busy_since = time.monotonic()
                server.in_flight += 1
                server.requests += 1
                return server
            self._changed.clear()
            await self._changed.wait()

    def _release(self, server: Server) -> None:
        server.in_flight -= 1
        self._changed_now()

    def _changed_now(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _call(self, server: Server, path: str, body: dict | None, call: _Call) -> dict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, lambda: http_json(server.url + path, body,
                                          timeout=self.config.timeout_s, call=call))

    # ---- health
    def stall_bound(self) -> float:
        """Seconds a server holding requests may answer nothing before it is probed:
        4 × the slowest of the last 64 replies, at least `health_check_s`, at most
        `timeout_s`; `timeout_s` before the first reply."""
        cfg = self.config
        if not self._durations:
            return cfg.timeout_s
        return min(cfg.timeout_s, max(cfg.health_check_s, STALL_FACTOR * max(self._durations)))

    def lost_summary(self) -> str:
        """One line: every server of the pool is lost, and why."""
        return "every server of the pool is lost: " + "; ".join(
            f"{s.url}: {s.lost}" for s in self.servers)

    def _lose(self, server: Server, reason: str) -> None:
        """Stop sending `server` requests; take back the ones it holds (they go to live
        servers); say so in one line."""
        if server.lost is not None:
            return
        server.lost, server.lost_at = reason, time.monotonic()
        server.last_probe = server.lost_at
        held = len(server.calls)
        for call in list(server.calls):
            call.abort()
        live = sum(s.lost is None for s in self.servers)
        moved = f"its {held} request(s) go to" if held else "going on with"
        where = f"{moved} {live} live server(s)" if live else "no live server left"
        self.notify(f"warning: server {server.url} lost: {reason}; {where}")
        self._changed_now()

    def _back(self, server: Server, note: str = "") -> None:
        now = time.monotonic()
        away = now - server.lost_at
        server.lost, server.last_reply = None, now
        self.notify(f"server {server.url} is back after {away:.1f} s{note}")
        self._changed_now()

    def _health(self, server: Server) -> str | None:
        """None when `server`/health answers within `health_check_s`, else why not."""
        try:
            http_json(server.url + "/health", None, timeout=self.config.health_check_s)
        except (_Retryable, ServerError) as exc:
            return str(exc)
        return None

    def _revive(self, server: Server) -> str | None:
        """A lost server answering /health is given the current weights (training; always:
        it may be a restarted process serving its initial ones). None when it can come
        back, else why not."""
        problem = self._health(server)
        if problem is None and self._weights is not None:
            try:
                self._reload(server, self._weights)
            except (_Retryable, ServerError) as exc:
                return f"could not reload the weights: {exc}"
        return problem

    async def _watch_servers(self) -> None:
        """While requests are active: lose a busy server that has stalled and whose /health
        does not answer; probe lost servers and bring back those that answer; say every
        `progress_s` how the pool is doing."""
        cfg = self.config
        tick = min(WATCH_TICK_S, cfg.health_check_s)
        last_line = time.monotonic()
        replies_then = self._replies
        while True:
            await asyncio.sleep(tick)
            if self._active == 0:
                return
            now = time.monotonic()
            bound = self.stall_bound()
            for s in self.servers:
                if s.probing:
                    continue
                if s.lost is None and s.in_flight:
                    silent = now - max(s.last_reply, s.busy_since)
                    if silent > bound:
                        self._spawn(self._probe_stalled(s, silent, bound))
                elif s.lost is not None and now - s.last_probe >= cfg.health_check_s:
                    self._spawn(self._probe_lost(s))
            if cfg.progress_s and now - last_line >= cfg.progress_s:
                self.notify(self.progress_line(self._replies - replies_then, now - last_line))
                last_line, replies_then = now, self._replies

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe_stalled(self, server: Server, silent: float, bound: float) -> None:
        server.probing = True
        try:
            loop = asyncio.get_running_loop()
            problem = await loop.run_in_executor(self._probes, self._health, server)
            if problem is None:
                server.last_reply = time.monotonic()  # alive, only slow: wait on
            else:
                self._lose(server, f"no reply for {silent:.1f} s (bound {bound:.1f} s), "
                                   f"/health: {problem}")
        finally:
            server.probing = False

    async def _probe_lost(self, server: Server) -> None:
        server.probing = True
        server.last_probe = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
            problem = await loop.run_in_executor(self._probes, self._revive, server)
            if problem is None and server.lost is not None:
                self._back(server)
        finally:
            server.probing = False

    def progress_line(self, replies: int, seconds: float) -> str:
        """What the pool is doing, in one line (printed every `progress_s` while waiting)."""
        now = time.monotonic()
        busy = ", ".join(f"{s.url} {s.in_flight}" for s in self.servers if s.lost is None)
        lost = [s.url for s in self.servers if s.lost is not None]
        last = max((s.last_reply for s in self.servers), default=0.0)
        ago = f"last reply {now - last:.1f} s ago" if last else "no reply yet"
        text = (f"pool: {replies} replies in the last {seconds:.0f} s, "
                f"{sum(s.in_flight for s in self.servers)} in flight ({busy or 'no live server'}); "
                f"{ago}")
        return text + (f"; lost: {', '.join(lost)}" if lost else "")

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
        path = Path(self.config.weights_dir) / f"step_{step:06d}"
        save_policy_weights(policy, path)
        self._weights = path

        def reload(server: Server) -> str | None:
            if server.lost is not None:
                return self._revive(server)
            self._reload(server, path)
            return None

        futures = {s: self._probes.submit(reload, s) for s in self.servers}
        for server, future in futures.items():
            try:
                problem = future.result()
            except (_Retryable, ServerError) as exc:
                self._lose(server, f"could not reload the weights of step {step}: {exc}")
                continue
            if problem is None and server.lost is not None:
                self._back(server, f" (weights of step {step} reloaded)")
        if all(s.lost is not None for s in self.servers):
            raise PoolLostError(self.lost_summary())
        for old in Path(self.config.weights_dir).glob("step_*"):
            if old != path and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        self.synced_step = step

    def _reload(self, server: Server, path: Path) -> None:
        """`server` reloads the weights in `path` and empties its prefix cache."""
        http_json(server.url + "/collective_rpc", {
            "method": "reload_weights", "kwargs": {"weights_path": str(path)},
        }, timeout=self.config.timeout_s)
        http_json(server.url + "/reset_prefix_cache", {}, timeout=self.config.timeout_s)
        server.last_reply = time.monotonic()

    def sleep(self) -> None:
        """Nothing to free here: the servers manage their own memory."""

    def wake(self) -> None:
        """Nothing to restore (see `sleep`)."""

    def close(self) -> None:
        """End every open request (none is left hanging on a frozen server); the servers
        run on."""
        for server in self.servers:
            for call in list(server.calls):
                call.abort()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._probes.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Requests, failures and health of each server (by URL, listed order)."""
        return {s.url: {"requests": s.requests, "failures": s.failures, "down": s.down,
                        "lost": s.lost} for s in self.servers}


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
            http_json(base_url.rstrip("/") + "/health", None, timeout=2)
            return
        except (_Retryable, ServerError):
            pass
        time.sleep(0.5)
    raise ServerError(f"{base_url} not ready after {timeout_s:.0f} s")

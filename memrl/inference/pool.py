"""A pool of OpenAI-compatible vLLM servers: which server takes a request, retries, and the
servers' health (the transport of `memrl.inference.openai.OpenAIEngine`).

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
  a retry. A lost server gets no request; it is probed every `health_check_s`, whether
  requests run or not, and comes back when `/health` answers (in training after reloading
  the current weights; a frozen server still runs what it was sent before, so a reload of
  an older step it held can land after that one, until the next step's sync). Each loss
  and each return is one line on stderr; while requests wait, a progress line every
  `progress_s` says what the pool is doing, so a stall is visible. So a frozen server costs
  at most the stall bound + 2 × `health_check_s` (+ 1 s of the monitor's tick). A monitor
  thread does all this, from the pool's first use until `close`.
- No live server left: `PoolLostError` (the CLI prints one line, with the command that
  continues, and exits 1).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError
from memrl.inference.config import OpenAIConfig
from memrl.inference.http import Call, Retryable, ServerError, http_json

STALL_FACTOR = 4.0
"""A busy server silent for this many times the slowest recent reply is probed."""
RECENT_REPLIES = 64
"""How many of the latest reply times `stall_bound` looks at."""
WATCH_TICK_S = 1.0
"""How often the monitor thread looks at the servers (`health_check_s` when smaller)."""


class PoolLostError(ServerError):
    """No live server is left in the pool."""


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
    calls: set[Call] = field(default_factory=set)

    @property
    def down(self) -> bool:
        return self.lost is not None


class ServerPool:
    """Servers behind one `request`: slots, retries, and a health monitor thread."""

    def __init__(
        self,
        config: OpenAIConfig,
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
        self.notify = notify
        """Where the pool's lines go (a server lost or back, progress): stderr by default."""
        shares: dict[str, int] = {}
        for url in config.base_urls:
            shares[url.rstrip("/")] = shares.get(url.rstrip("/"), 0) + 1
        self.servers = [Server(url, share) for url, share in shares.items()]
        workers = config.max_in_flight_per_server * len(config.base_urls)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memrl-http")
        self._probes = ThreadPoolExecutor(max_workers=2 * len(self.servers),
                                          thread_name_prefix="memrl-probe")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._lookup: asyncio.Lock | None = None
        self._lock = threading.Lock()
        """Guards each server's `lost`, `probing` and `calls` (the loop, the monitor thread
        and the probes change them)."""
        self._sync = threading.Lock()
        """Held while weights are reloaded (a step's sync, a returning server's reload)."""
        self._monitor: threading.Thread | None = None
        self._closed = threading.Event()
        self._active = 0
        self._replies = 0
        self._durations: deque[float] = deque(maxlen=RECENT_REPLIES)
        self._weights: Path | None = None
        """The weights every server must serve (training): a returning server reloads them."""

    def _bind_loop(self) -> None:
        """The pool's event and lock belong to one event loop: make them for the running
        one (each `generate` runs its own); the monitor thread runs from the first use on."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._changed = asyncio.Event()
            self._lookup = asyncio.Lock()
        self._start_monitor()

    async def request(self, path: str, body: dict) -> dict:
        """POST `body` to `path` of a live server and return its JSON answer; a failure is
        retried (on another server when there is one), a request taken back from a lost
        server is sent again without using up a retry. Too many failures: ServerError; no
        live server left: PoolLostError."""
        self._bind_loop()
        self._active += 1
        try:
            tried: list[Server] = []
            errors: list[str] = []
            while True:
                server = await self._acquire(tried)
                tried.append(server)
                call = Call()
                with self._lock:
                    server.calls.add(call)
                started = time.monotonic()
                try:
                    data = await self._call(server, path, body, call)
                except Retryable as exc:
                    if exc.unreachable:
                        self._lose(server, str(exc))
                    if not exc.moved:
                        server.failures += 1
                    if not (exc.moved or exc.unreachable):  # lost servers' use no retry
                        errors.append(f"{server.url}: {exc}")
                    if len(errors) > self.config.max_retries or len(tried) > (
                            self.config.max_retries + 4 * len(self.servers)):
                        raise ServerError(f"request failed on {len(tried)} attempt(s): "
                                          + "; ".join(errors[-3:])) from None
                    continue
                finally:
                    with self._lock:
                        server.calls.discard(call)
                    self._release(server)
                now = time.monotonic()
                server.last_reply = now
                with self._lock:  # the monitor thread reads them
                    self._durations.append(now - started)
                    self._replies += 1
                return data
        finally:
            self._active -= 1

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
        if self._changed is not None:
            self._changed.set()

    def _wake(self) -> None:
        """Wake requests waiting for a server (from any thread): the servers changed."""
        loop, changed = self._loop, self._changed
        if loop is None or changed is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(changed.set)
        except RuntimeError:  # the loop closed meanwhile: nobody waits
            pass

    async def _call(self, server: Server, path: str, body: dict | None, call: Call) -> dict:
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
        with self._lock:
            slowest = max(self._durations, default=None)
        if slowest is None:
            return cfg.timeout_s
        return min(cfg.timeout_s, max(cfg.health_check_s, STALL_FACTOR * slowest))

    def lost_summary(self) -> str:
        """One line: every server of the pool is lost, and why."""
        return "every server of the pool is lost: " + "; ".join(
            f"{s.url}: {s.lost}" for s in self.servers)

    def _lose(self, server: Server, reason: str) -> None:
        """Stop sending `server` requests; take back the ones it holds (they go to live
        servers); say so in one line."""
        with self._lock:
            if server.lost is not None:
                return
            server.lost, server.lost_at = reason, time.monotonic()
            server.last_probe = server.lost_at
            calls = list(server.calls)
            live = sum(s.lost is None for s in self.servers)
        moved = f"its {len(calls)} request(s) go to" if calls else "going on with"
        where = f"{moved} {live} live server(s)" if live else "no live server left"
        self.notify(f"warning: server {server.url} lost: {reason}; {where}")
        for call in calls:  # said first: a request taken back may end the run at once
            call.abort()
        self._wake()

    def _back(self, server: Server, note: str = "") -> None:
        with self._lock:
            if server.lost is None:
                return
            now = time.monotonic()
            away = now - server.lost_at
            server.lost, server.last_reply = None, now
        self.notify(f"server {server.url} is back after {away:.1f} s{note}")
        self._wake()

    def _health(self, server: Server) -> str | None:
        """None when `server`/health answers within `health_check_s`, else why not."""
        try:
            http_json(server.url + "/health", None, timeout=self.config.health_check_s)
        except (Retryable, ServerError) as exc:
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
            except (Retryable, ServerError) as exc:
                return f"could not reload the weights: {exc}"
        return problem

    def _start_monitor(self) -> None:
        if self._monitor is None and not self._closed.is_set():
            self._monitor = threading.Thread(target=self._monitor_servers, name="memrl-pool-health",
                                             daemon=True)
            self._monitor.start()

    def _monitor_servers(self) -> None:
        """The monitor thread, from the pool's first use until `close`: every tick, probe a
        live server that holds requests and has stalled (lost if its /health does not
        answer) and every lost server due for a probe (back if it answers); while requests
        are active, a progress line every `progress_s`. Probes run in their own threads."""
        cfg = self.config
        tick = min(WATCH_TICK_S, cfg.health_check_s)
        last_line, replies_then = time.monotonic(), self._replies
        while not self._closed.wait(tick):
            now = time.monotonic()
            bound = self.stall_bound()
            for s in self.servers:
                with self._lock:
                    if s.probing:
                        continue
                    silent = now - max(s.last_reply, s.busy_since)
                    stalled = s.lost is None and s.in_flight > 0 and silent > bound
                    due = s.lost is not None and now - s.last_probe >= cfg.health_check_s
                    s.probing = stalled or due
                    if due:
                        s.last_probe = now
                try:
                    if stalled:
                        self._probes.submit(self._probe_stalled, s, silent, bound)
                    elif due:
                        self._probes.submit(self._probe_lost, s)
                except RuntimeError:  # the interpreter is shutting down
                    return
            if not self._active:
                last_line, replies_then = now, self._replies
            elif cfg.progress_s and now - last_line >= cfg.progress_s:
                self.notify(self.progress_line(self._replies - replies_then, now - last_line))
                last_line, replies_then = now, self._replies

    def _probe_stalled(self, server: Server, silent: float, bound: float) -> None:
        try:
            problem = self._health(server)
            if problem is None:
                server.last_reply = time.monotonic()  # alive, only slow: wait on
            else:
                self._lose(server, f"no reply for {silent:.1f} s (bound {bound:.1f} s), "
                                   f"/health: {problem}")
        finally:
            server.probing = False

    def _probe_lost(self, server: Server) -> None:
        if not self._sync.acquire(blocking=False):  # a step's sync deals with it
            server.probing = False
            return
        try:
            if server.lost is not None and self._revive(server) is None:
                self._back(server)
        finally:
            self._sync.release()
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

    # ---- weights
    def reload_all(self, path: Path, step: int) -> None:
        """Have every server reload the weights in `path` (step `step`) at once: a lost
        server is probed first and comes back if it answers; a server that fails the reload
        is lost. None taking them: PoolLostError. A server that returns later reloads them."""
        self._start_monitor()
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
            except (Retryable, ServerError) as exc:
                self._lose(server, f"could not reload the weights of step {step}: {exc}")
                continue
            if problem is None and server.lost is not None:
                self._back(server, f" (weights of step {step} reloaded)")
        if all(s.lost is not None for s in self.servers):
            raise PoolLostError(self.lost_summary())

    def _reload(self, server: Server, path: Path) -> None:
        """`server` reloads the weights in `path` and empties its prefix cache."""
        http_json(server.url + "/collective_rpc", {
            "method": "reload_weights", "kwargs": {"weights_path": str(path)},
        }, timeout=self.config.timeout_s)
        http_json(server.url + "/reset_prefix_cache", {}, timeout=self.config.timeout_s)
        server.last_reply = time.monotonic()

    def close(self) -> None:
        """Stop the health monitor and end every open request (none is left hanging on a
        frozen server); the servers run on."""
        self._closed.set()
        with self._lock:
            calls = [c for server in self.servers for c in server.calls]
        for call in calls:
            call.abort()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._probes.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Requests, failures and health of each server (by URL, listed order)."""
        return {s.url: {"requests": s.requests, "failures": s.failures, "down": s.down,
                        "lost": s.lost} for s in self.servers}

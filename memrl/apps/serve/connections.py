"""The connections of `memrl serve`, guarded before a request reaches the application.

uvicorn's h11 protocol, with three guards a client that stalls or floods cannot get past:

    a request's head (its line and headers) must arrive whole within `header_timeout_s` of
        the connection's start (or of the previous response on a kept-alive connection):
        else 408 and the connection is closed;
    at most `max_connections_per_client` open connections per client address: one more is
        answered 429 and closed at once;
    a request that is not HTTP is 400 (uvicorn's answer), logged as one line naming the
        client instead of uvicorn's line without it.

Each is one log line (`memrl.apps.serve`: status, reason, client; never a body or a key). The
body's own timeout is the application's (`memrl.apps.serve.app.read_body`): only a route that
reads a body waits for one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from memrl.recipes.reading import ServeConfig

log = logging.getLogger("memrl.apps.serve")

INVALID_HTTP = "Invalid HTTP request received."
"""uvicorn's line for a request that is not HTTP (replaced by one naming the client)."""


def guarded_protocol(config: ServeConfig) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol class with the guards of the module docstring, its counts of
    connections per client shared by the connections of one server."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    open_per_client: Counter[str] = Counter()

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            self._address = self.client[0] if self.client else "unknown"
            open_per_client[self._address] += 1
            if open_per_client[self._address] > config.max_connections_per_client:
                self._refuse(429, f"too many connections from this client (limit "
                             f"{config.max_connections_per_client})")
                return
            self._wait_for_head(served=False)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            open_per_client[self._address] -= 1
            if open_per_client[self._address] <= 0:
                del open_per_client[self._address]
            super().connection_lost(exc)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's head arrived whole
                self._stop_head_timer()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():
                self._wait_for_head(served=True)

        def send_400_response(self, msg: str) -> None:
            self._stop_head_timer()
            log.warning("400 %s: not an HTTP request (malformed request line or headers)",
                        self._who())
            super().send_400_response(msg)

        def _wait_for_head(self, served: bool) -> None:
            self._stop_head_timer()
            self._received_since = 0
            self._head_timer = self.loop.call_later(config.header_timeout_s,
                                                    self._head_timed_out, served)

        def data_received(self, data: bytes) -> None:
            self._received_since = getattr(self, "_received_since", 0) + len(data)
            super().data_received(data)

        def _head_timed_out(self, served: bool) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if served and not self._received_since:  # idle between requests: just close
                self.transport.close()
                return
            self._refuse(408, f"the request's head did not arrive within "
                         f"{config.header_timeout_s:g} s")

        def _stop_head_timer(self) -> None:
            timer = getattr(self, "_head_timer", None)
            if timer is not None:
                timer.cancel()
                self._head_timer = None

        def _refuse(self, status: int, reason: str) -> None:
            refuse(self.transport, self._who(), status, reason)

        def _who(self) -> str:
            return "client %s:%d" % self.client if self.client else "client unknown"

    return GuardedH11Protocol


def refuse(transport: Any, who: str, status: int, reason: str) -> None:
    """Answer `status` with a one-line JSON error, close the connection, log one line."""
    import json

    from memrl.apps.serve.protocol import error_body

    log.warning("%d %s: %s", status, who, reason)
    body = json.dumps(error_body(status, reason)).encode()
    phrase = {408: "Request Timeout", 429: "Too Many Requests"}[status]
    transport.write(
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    transport.close()


class DropInvalidHttpLine(logging.Filter):
    """Drops uvicorn's line for a request that is not HTTP (the guard logs one naming the
    client)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != INVALID_HTTP

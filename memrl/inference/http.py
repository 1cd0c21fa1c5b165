"""One JSON exchange with a server over HTTP, in a worker thread, that another thread can end
at once; with the standard library only (http.client): no extra dependency.

Errors say what another try may do: `Retryable` (no connection, a reset, no answer in time,
HTTP 5xx, a cut answer) and `ServerError` (a 4xx: the request itself is wrong).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from memrl.errors import InfrastructureError


class ServerError(InfrastructureError):
    """A request the servers could not answer (after every retry), or an answer that is not
    vLLM's."""


class Retryable(Exception):
    """A failure another server (or a later try) may not have."""

    def __init__(self, message: str, *, unreachable: bool = False, moved: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        """The server could not be connected to (refused, no route): it is lost."""
        self.moved = moved
        """The pool took the request back from a lost server: not the request's failure."""


class Call:
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
            raise Retryable("taken back from a lost server", moved=True)

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


def http_json(url: str, body: dict | None, *, timeout: float, call: Call | None = None) -> Any:
    """One blocking HTTP exchange (in a worker thread): JSON in (POST; GET without `body`),
    JSON out. Raises `Retryable` for what another try may not meet (no connection, a reset,
    no answer within `timeout`, HTTP 5xx, a cut answer) and `ServerError` for a 4xx."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    call = call or Call()
    conn = cls(parts.hostname or "", parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        call.attach(conn)
        try:
            conn.connect()
        except TimeoutError:
            raise Retryable(f"no connection within {timeout:g} s", unreachable=True) from None
        except OSError as exc:
            raise Retryable(_reason(exc), unreachable=True) from None
        call.check()
        data = None if body is None else json.dumps(body).encode()
        try:
            conn.request("GET" if body is None else "POST", target, body=data,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
        except TimeoutError:
            call.check()
            raise Retryable(f"no answer within {timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            call.check()
            raise Retryable(_reason(exc)) from None
    finally:
        conn.close()
    if response.status >= 500:
        raise Retryable(f"HTTP {response.status}: {_text(payload)}")
    if response.status >= 400:
        raise ServerError(f"{url}: HTTP {response.status}: {_text(payload)}")
    try:
        return json.loads(payload) if payload.strip() else {}
    except json.JSONDecodeError:
        raise Retryable(f"an answer that is not JSON: {_text(payload)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(payload: bytes) -> str:
    return " ".join(payload.decode(errors="replace").split())[:300]


def wait_until_ready(base_url: str, timeout_s: float = 120.0) -> None:
    """Block until `base_url`/health answers 200 (a server just started), or raise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            http_json(base_url.rstrip("/") + "/health", None, timeout=2)
            return
        except (Retryable, ServerError):
            pass
        time.sleep(0.5)
    raise ServerError(f"{base_url} not ready after {timeout_s:.0f} s")

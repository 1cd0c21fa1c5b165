"""`memrl serve`: a memory agent behind an OpenAI-compatible HTTP endpoint (Starlette + uvicorn).

    POST /v1/chat/completions   documents + question in the messages (memrl.apps.serve.protocol)
    GET  /v1/models             the one model served
    GET  /health                {"status": "ok", ...}; no API key needed

Every request is one `MemAgent.aread` episode on the one shared engine: its turns go out
through `agenerate` as soon as its previous one is answered, so concurrent requests are
batched by the engine (vLLM's continuous batching, the server pool's, or `BatchingEngine`
in front of the HF engine). Documents are counted in a worker thread before the reading
starts, so a request over the limits is refused at once (413), before any model call.

Limits (`ServeConfig`): body size (413), document tokens (413), requests at once (429),
a head or body that does not arrive in time (408), connections per client (429; the last
two in `memrl.apps.serve.connections` for the head). A request takes one of the
`max_concurrent_requests` slots only once its body is read whole, so clients that stall
their bodies hold no slot; a client that closes its connection has its episode cancelled
and its slot given back at once (streamed or not). An API key, when its environment
variable is set, is compared in constant time (`hmac.compare_digest`) and never logged.

Every request is one log line (`RequestLog`): status, client, method, path, time and, for a
failure, the reason; never a body or a key, never a traceback for a client's fault (a 500,
a fault of the server, keeps its traceback). SIGTERM (or Ctrl-C) stops uvicorn gracefully:
it stops accepting connections, lets the requests in flight finish (streams included) for
at most `shutdown_timeout_s`, cancels what is left (503, one line each), then the engine
is closed; a second signal forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from memrl.agents.memagent import MemAgentConfig
from memrl.apps.ask.api import AskProgress, document_chunks, read
from memrl.apps.ask.chunking import DocumentChunks, TooManyTokens
from memrl.apps.ask.documents import open_document
from memrl.recipes.reading import ServeConfig
from memrl.apps.serve.protocol import (
    ApiError,
    ChatRequest,
    Completion,
    error_body,
    finish_reason,
    parse_request,
    split_messages,
    sse,
)
from memrl.errors import MemrlInputError, require

log = logging.getLogger("memrl.apps.serve")


class ServerState:
    """What the handlers share: the engine, the settings, the requests in flight."""

    def __init__(self, engine: Any, model_name: str, agent: MemAgentConfig,
                 config: ServeConfig, api_key: str | None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.agent = agent
        self.config = config
        self._api_key = api_key.encode() if api_key else None
        self.in_flight = 0
        self.served = 0
        self.started = int(time.time())

    def health(self) -> dict[str, Any]:
        """`GET /health`: the model, the requests in flight and served, the batching's
        statistics (an engine that keeps them)."""
        body: dict[str, Any] = {"status": "ok", "model": self.model_name,
                                "in_flight": self.in_flight, "served": self.served}
        stats = getattr(self.engine, "stats", None)
        if isinstance(stats, dict):
            body["batching"] = stats
        return body

    def authorize(self, headers: Any) -> None:
        """ApiError(401) unless the request carries the key (when one is set)."""
        if self._api_key is None:
            return
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                 self._api_key):
            raise ApiError(401, "invalid or missing API key (send Authorization: Bearer "
                           "<key>)")

    def agent_config(self, request: ChatRequest) -> MemAgentConfig:
        overrides = request.agent_overrides()
        if not overrides:
            return self.agent
        try:
            return MemAgentConfig(**{**self.agent.model_dump(), **overrides})
        except ValueError as exc:
            raise ApiError(400, f"bad sampling setting: {exc}") from None


def build_app(engine: Any, *, model_name: str, agent: MemAgentConfig,
              config: ServeConfig | None = None, api_key: str | None = None) -> Any:
    """The Starlette application serving `engine` (closed when the app shuts down)."""
    starlette = require("starlette", extra="serve", feature="memrl serve")
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    del starlette
    state = ServerState(engine, model_name, agent, config or ServeConfig(), api_key)

    class ReleasingStream(StreamingResponse):
        """A stream that gives its request's slot back however it ends (finished, the
        client gone before or during it, an error)."""

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                state.in_flight -= 1

    async def health(request: Request) -> Response:
        return JSONResponse(state.health())

    async def models(request: Request) -> Response:
        state.authorize(request.headers)
        return JSONResponse({"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.started,
            "owned_by": "memrl"}]})

    async def chat(request: Request) -> Response:
        state.authorize(request.headers)
        body = await read_body(request, state.config.max_request_bytes,
                               state.config.body_timeout_s)
        if state.in_flight >= state.config.max_concurrent_requests:
            raise ApiError(429, f"too many requests at once (limit "
                           f"{state.config.max_concurrent_requests}); retry later")
        state.in_flight += 1
        streaming = False
        try:
            req = parse_request(body)
            if req.model != state.model_name:
                raise ApiError(404, f"model {req.model!r} is not served here (this server "
                               f"serves {state.model_name!r})", "model")
            documents, question = split_messages(req.messages)
            cfg = state.agent_config(req)
            chunks = await count(state, documents, cfg)
            completion = Completion(state.model_name)
            if req.stream:
                include_usage = bool(req.stream_options and req.stream_options.include_usage)
                streaming = True
                return ReleasingStream(
                    stream(state, chunks, question, cfg, completion, include_usage),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            result = await unless_gone(request.receive,
                                       read(state.engine, chunks, question, cfg))
            state.served += 1
            return JSONResponse(completion.body(result))
        finally:
            if not streaming:
                state.in_flight -= 1

    return RequestLog(Starlette(
        routes=[Route("/health", health, methods=["GET"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/v1/chat/completions", chat, methods=["POST"])],
        exception_handlers={ApiError: api_error, HTTPException: http_error,
                            Exception: server_error},
        lifespan=lambda app: closing(state.engine),
    ))


@contextlib.asynccontextmanager
async def closing(engine: Any) -> AsyncIterator[None]:
    """The app's lifespan: `engine` closed (off the event loop) when the app shuts down."""
    try:
        yield
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            await asyncio.to_thread(close)


async def api_error(request: Any, exc: Exception) -> Any:
    from starlette.responses import JSONResponse

    assert isinstance(exc, ApiError)
    unread = exc.status in (408, 413)  # a body not read whole: the connection ends
    return JSONResponse(exc.body(), status_code=exc.status,
                        headers={"connection": "close"} if unread else None)


async def http_error(request: Any, exc: Any) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(error_body(exc.status_code, str(exc.detail)),
                        status_code=exc.status_code)


async def server_error(request: Any, exc: Exception) -> Any:
    from starlette.responses import JSONResponse

    # the JSON body of a 500; RequestLog logs it (with its traceback: the server's fault)
    return JSONResponse(error_body(500, f"the server failed: {type(exc).__name__}: "
                                   f"{_first_line(exc)}"), status_code=500)


async def read_body(request: Any, limit: int, timeout_s: float) -> bytes:
    """The request body: 413 as soon as it is known to exceed `limit` bytes, 408 unless it
    arrives whole within `timeout_s`, 499 when the client leaves before it has."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {int(declared):,} bytes is over the limit of "
                       f"{limit:,} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for piece in request.stream():
                body += piece
                if len(body) > limit:
                    raise ApiError(413, f"request body over the limit of {limit:,} bytes")
    except TimeoutError:
        raise ApiError(408, f"the request's body did not arrive within {timeout_s:g} s "
                       f"({len(body):,} bytes came)") from None
    except ClientDisconnect:
        raise ApiError(499, "the client closed the connection before its body "
                       "arrived") from None
    return bytes(body)


async def unless_gone(receive: Any, work: Any) -> Any:
    """The result of the coroutine `work`, or ApiError(499) as soon as the client closes
    its connection (`work` is then cancelled: its episode stops, its slot is free)."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        raise ApiError(499, "the client closed the connection; its episode was cancelled")
    return task.result()


class RequestLog:
    """ASGI middleware: one log line per request (status, client, method, path, seconds;
    for a failure its reason, from the error body), and no traceback but a 500's. A request
    cancelled by the server's shutdown (its graceful time is up) is a 503, one line; a
    client gone mid-response is a 499, one line."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: dict[str, Any] = {"status": None, "complete": False, "gone": False,
                                "error": b""}

        async def watched_receive() -> Any:
            message = await receive()
            seen["gone"] = seen["gone"] or message["type"] == "http.disconnect"
            return message

        async def watched_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body":
                if seen["status"] >= 400 and len(seen["error"]) < 4096:
                    seen["error"] += message.get("body", b"")
                seen["complete"] = not message.get("more_body", False)
            await send(message)

        failure: BaseException | None = None
        try:
            await self.app(scope, watched_receive, watched_send)
        except asyncio.CancelledError:
            await self._end(seen, watched_send, 503, "cancelled: the server is shutting down "
                            "and its graceful time is up")
        except Exception as exc:  # noqa: BLE001 - a fault of the server: logged below
            failure = exc
            await self._end(seen, watched_send, 500, f"the server failed: "
                            f"{type(exc).__name__}: {_first_line(exc)}")
        self._log(scope, seen, time.perf_counter() - start, failure)

    @staticmethod
    async def _end(seen: dict[str, Any], send: Any, status: int, reason: str) -> None:
        """Answer `status` if nothing was sent yet, else end the response begun."""
        import json

        body = json.dumps(error_body(status, reason)).encode()
        with contextlib.suppress(Exception):
            if seen["status"] is None:
                await send({"type": "http.response.start", "status": status, "headers": [
                    (b"content-type", b"application/json"), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
            elif not seen["complete"]:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        seen["reason"], seen["logged"] = reason, status

    @staticmethod
    def _log(scope: Any, seen: dict[str, Any], elapsed: float,
             failure: BaseException | None) -> None:
        status, reason = seen.get("logged") or seen["status"] or 500, seen.get("reason")
        if seen["gone"] and not seen["complete"]:
            status, reason = 499, "the client closed the connection mid-response"
        if reason is None and status >= 400:
            reason = _error_message(seen["error"])
        client = "%s:%d" % tuple(scope["client"]) if scope.get("client") else "unknown"
        line = (f"{status} client {client} {scope['method']} {scope['path']} "
                f"{elapsed:.2f} s" + (f": {reason}" if reason else ""))
        level = (logging.ERROR if status >= 500 else logging.WARNING if status >= 400
                 else logging.INFO)
        log.log(level, "%s", line, exc_info=failure)


def _error_message(body: bytes) -> str:
    """The `error.message` of a JSON error body (what the client was told), else ''."""
    import json

    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""


async def count(state: ServerState, documents: list[str], cfg: MemAgentConfig
                ) -> DocumentChunks:
    """The documents as chunks (counted in a worker thread); 413 over the token limit."""
    try:
        docs = [open_document(text, name=f"message {i}")
                for i, text in enumerate(documents, 1)]
        return await asyncio.to_thread(document_chunks, state.engine.tokenizer, docs, cfg,
                                       state.config.max_document_tokens)
    except TooManyTokens as exc:
        raise ApiError(413, f"the documents have more than {exc.limit:,} tokens (the "
                       "server's limit)", "messages") from None
    except MemrlInputError as exc:
        raise ApiError(400, str(exc), "messages") from None


async def stream(state: ServerState, chunks: DocumentChunks, question: str,
                 cfg: MemAgentConfig, completion: Completion, include_usage: bool
                 ) -> AsyncIterator[bytes]:
    """The server-sent events of one streamed request (memrl.apps.serve.protocol)."""
    events: asyncio.Queue[AskProgress] = asyncio.Queue()
    task = asyncio.ensure_future(read(state.engine, chunks, question, cfg,
                                      progress=events.put_nowait))
    try:
        yield sse(completion.chunk({"role": "assistant", "content": ""}))
        while not task.done() or not events.empty():
            getter = asyncio.ensure_future(events.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            event = getter.result()
            if not event.done:
                yield sse(completion.progress_chunk(event))
        try:
            result = task.result()
        except Exception as exc:  # noqa: BLE001 - reported to the client, logged here
            log.exception("the server failed in a streamed request")
            yield sse(error_body(500, f"the server failed: {type(exc).__name__}: "
                                 f"{_first_line(exc)}"))
            return
        state.served += 1
        yield sse(completion.chunk({"content": result.response}))
        yield sse(completion.chunk({}, finish_reason(result)))
        if include_usage:
            yield sse(completion.usage_chunk(result))
        yield sse("[DONE]")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def serve(engine: Any, *, model_name: str, agent: MemAgentConfig, config: ServeConfig,
          api_key: str | None, log_level: str = "info") -> None:
    """Run the server until SIGTERM / Ctrl-C (graceful: requests in flight finish)."""
    uvicorn = require("uvicorn", extra="serve", feature="memrl serve")
    from memrl.apps.serve.connections import guarded_protocol

    app = build_app(engine, model_name=model_name, agent=agent, config=config,
                    api_key=api_key)
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level,
        log_config=log_config(), access_log=False, http=guarded_protocol(config),
        timeout_graceful_shutdown=config.shutdown_timeout_s, lifespan="on"))
    server.run()


def log_config() -> dict[str, Any]:
    """uvicorn's logging, with memrl.apps.serve's lines (one per request) on the same stream and
    uvicorn's own line for a request that is not HTTP dropped (memrl.apps.serve.connections
    logs one naming the client)."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"invalid_http": {
        "()": "memrl.apps.serve.connections.DropInvalidHttpLine"}}
    config["handlers"]["default"]["filters"] = ["invalid_http"]
    config["loggers"]["memrl.apps.serve"] = {"handlers": ["default"], "level": "INFO",
                                        "propagate": False}
    return config


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

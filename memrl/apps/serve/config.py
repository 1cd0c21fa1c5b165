"""Settings of `memrl serve`: where it listens, what it accepts, who may call it."""

from __future__ import annotations

from pydantic import Field

from memrl.config import StrictModel


class ServeConfig(StrictModel):
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0: every interface; then set an API key)."""
    port: int = Field(8000, ge=0, le=65535)
    """Port to listen on (0: any free port, printed at start)."""
    served_model_name: str | None = None
    """The model's name in /v1/models and in requests' `model`; None: the model
    directory's name."""
    max_request_bytes: int = Field(32 << 20, ge=1)
    """Largest request body in bytes (a larger one is refused with 413). 32 MiB holds a
    million-token document of English text a few times over."""
    max_document_tokens: int = Field(2_000_000, ge=1)
    """Most tokens the documents of one request may have together (more: 413)."""
    max_concurrent_requests: int = Field(64, ge=1)
    """Chat requests worked on at once; one more is refused with 429 (retry later)."""
    header_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    """Seconds a request's head (request line and headers) may take to arrive, from the
    connection's start or the previous response; later: 408 and the connection closed."""
    body_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    """Seconds a chat request's body may take to arrive whole once its head has; later: 408
    and the connection closed. A request takes a slot of max_concurrent_requests only once
    its body is read, so a stalled body holds none. Raise it for large documents sent over
    slow links."""
    max_connections_per_client: int = Field(64, ge=1)
    """Open connections one client address may hold; one more is answered 429 and closed.
    Behind a proxy every client has the proxy's address: raise it there."""
    shutdown_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    """On SIGTERM / Ctrl-C, seconds the requests in flight get to finish; those still
    running then are cancelled (503, or their stream ended) and the server exits."""
    api_key_env: str = "MEMRL_API_KEY"
    """Environment variable holding the API key. When it is set (and not empty), every
    /v1 request must send `Authorization: Bearer <key>`; /health stays open."""

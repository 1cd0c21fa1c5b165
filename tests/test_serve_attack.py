"""`memrl serve` under attack on 127.0.0.1 (issue 47): clients that stall their heads or
bodies, flood connections, vanish mid-request, send what is not HTTP, JSON or Unicode, and a
SIGTERM with requests in flight. Each attack is bounded in count and time; the server's
whole log is checked at the end: one line per failed request, no traceback.

Loopback has many addresses (127.0.0.0/8): a client bound to 127.0.0.2 is another client
for the per-client connection cap."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.request

import pytest
from helpers import start_tiny_server, stop_process

KEY = "attack-key-Wq42"
TIMEOUT_S = 3.0
"""The server's header and body timeouts here (the default is 10 s)."""
DOC = "\n".join(f"Entry {i}: the river city of Marchetti was founded in {1500 + i}."
                for i in range(60))

pytestmark = [pytest.mark.xdist_group("memrl_serve_attack"), pytest.mark.slow]


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30,
                                    source_address=(source, 0))
    return sock


def _body(doc: str = DOC, **extra) -> bytes:
    return json.dumps({"model": "tiny", "messages": [
        {"role": "user", "content": doc}, {"role": "user", "content": "When?"}], **extra
    }).encode()


def _head(body_length: int, path: str = "/v1/chat/completions") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {body_length}\r\n\r\n"
            ).encode()


def _status(sock: socket.socket) -> int:
    """The status of the response on `sock` (0 when it closes without one)."""
    data = b""
    while b"\r\n" not in data:
        piece = sock.recv(4096)
        if not piece:
            return 0
        data += piece
    return int(data.split(b" ", 2)[1])


def _health(base: str) -> dict:
    with urllib.request.urlopen(base + "/health", timeout=30) as response:
        return json.loads(response.read())


def _chat(base: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    pytest.importorskip("uvicorn")
    log = tmp_path_factory.mktemp("attack") / "server.log"
    proc, base = start_tiny_server(
        tiny_model_dir, log, KEY, "serve.max_concurrent_requests=64",
        "serve.max_connections_per_client=70", f"serve.header_timeout_s={TIMEOUT_S}",
        f"serve.body_timeout_s={TIMEOUT_S}", "serve.shutdown_timeout_s=5")
    port = int(base.rsplit(":", 1)[1])
    yield {"base": base, "port": port, "proc": proc, "log": log}
    stop_process(proc)


def test_64_stalled_bodies_hold_no_slot_and_are_408_after_the_timeout(server):
    body = _body()
    stalled = []
    for _ in range(64):  # headers and half a body, then nothing
        sock = _connect(server["port"], "127.0.0.2")
        sock.sendall(_head(len(body)) + body[: len(body) // 2])
        stalled.append(sock)
    try:
        start = time.time()
        code, reply = _chat(server["base"], body)
        assert code == 200, reply
        assert time.time() - start < 60
        assert _health(server["base"])["in_flight"] == 0
        statuses = []
        for sock in stalled:
            sock.settimeout(TIMEOUT_S + 30)
            statuses.append(_status(sock))
        assert statuses == [408] * 64
        assert time.time() - start < TIMEOUT_S + 60
    finally:
        for sock in stalled:
            sock.close()


def test_a_stalled_head_is_408_and_a_flood_of_connections_is_capped(server):
    slow = _connect(server["port"])
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and no more
    start = time.time()
    slow.settimeout(TIMEOUT_S + 30)
    assert _status(slow) == 408
    assert TIMEOUT_S - 0.5 <= time.time() - start < TIMEOUT_S + 30
    slow.close()
    flood = [_connect(server["port"], "127.0.0.3") for _ in range(70)]
    extra = _connect(server["port"], "127.0.0.3")
    try:
        extra.settimeout(30)
        assert _status(extra) == 429  # the 71st connection of one client
        assert _health(server["base"])["status"] == "ok"  # other clients are served
    finally:
        for sock in [*flood, extra]:
            sock.close()


def test_a_client_gone_mid_request_frees_its_slot_within_a_second(server):
    served = _health(server["base"])["served"]
    body = _body("\n".join([DOC] * 3))
    sock = _connect(server["port"])
    sock.sendall(_head(len(body)) + body)
    deadline = time.time() + 60
    while _health(server["base"])["in_flight"] != 1:
        assert time.time() < deadline, "the request never started"
        time.sleep(0.02)
    sock.close()
    gone = time.time()
    while _health(server["base"])["in_flight"] != 0:
        assert time.time() - gone < 1.0, "the slot was not freed within a second"
        time.sleep(0.02)
    assert _health(server["base"])["served"] == served  # cancelled, not finished


@pytest.mark.parametrize("raw", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)),  # a TLS hello
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n",
])
def test_what_is_not_http_is_a_400(server, raw):
    sock = _connect(server["port"])
    sock.sendall(raw)
    sock.settimeout(30)
    assert _status(sock) == 400
    sock.close()


@pytest.mark.parametrize("body,status", [
    (b"\xff\xfe{not json", 400),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800 doc"}, '
     b'{"role": "user", "content": "Q?"}]}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "doc"}, '
     b'{"role": "user", "content": "\\udc80?"}]}', 400),
    (b"[" * 50_000, 400),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": {"a": 1}}]}', 400),
])
def test_bodies_that_are_not_json_or_unicode_are_400s(server, body, status):
    code, reply = _chat(server["base"], body)
    assert code == status and "\n" not in reply["error"]["message"], reply


def test_the_whole_log_has_one_line_per_failure_and_no_traceback(server):
    """After the attacks above (this module's order): their failures, one line each."""
    text = server["log"].read_text()
    assert "Traceback" not in text and "Exception in" not in text, text
    assert KEY not in text
    lines = text.splitlines()
    assert sum("408 client" in line and "did not arrive within" in line
               for line in lines) == 65, text  # 64 bodies, 1 head
    assert sum("429 client 127.0.0.3" in line for line in lines) == 1, text
    assert sum("499 client" in line for line in lines) >= 1, text
    assert sum("400 client" in line for line in lines) >= 9, text  # 4 not HTTP, 5 bodies


def test_sigterm_with_requests_in_flight_and_stalled_bodies_is_bounded(server):
    """Last: it stops the server. A request in flight past the graceful time is cancelled
    (503, one line); a stalled body does not hold the exit up."""
    body = _body("\n".join([DOC] * 6))
    stalled = _connect(server["port"], "127.0.0.4")
    stalled.sendall(_head(len(body)) + body[:10])
    results: list = []
    worker = threading.Thread(target=lambda: results.append(_chat(server["base"], body)))
    worker.start()
    deadline = time.time() + 60
    while _health(server["base"])["in_flight"] != 1:
        assert time.time() < deadline, "the request never started"
        time.sleep(0.02)
    server["proc"].send_signal(signal.SIGTERM)
    start = time.time()
    code = server["proc"].wait(timeout=60)
    took = time.time() - start
    assert code in (0, -signal.SIGTERM), (code, server["log"].read_text()[-3000:])
    # graceful time, a body's timeout, and room for a loaded 2-core CI machine
    assert took < 5 + TIMEOUT_S + 30, (took, server["log"].read_text()[-3000:])
    worker.join(timeout=60)
    stalled.close()
    assert results and results[0][0] in (200, 503), results
    text = server["log"].read_text()
    assert "Traceback" not in text and "Exception in" not in text, text

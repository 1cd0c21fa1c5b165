"""`memrl serve`: the message convention and errors, then a real server process on the tiny
model called through the official `openai` client: plain, streaming, malformed bodies,
limits (413, 429), API keys (401), 16 concurrent requests, and a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers import start_tiny_server, stop_process
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.apps.serve.protocol import ApiError, Message, parse_request, split_messages

KEY = "test-key-Zq81"
DOC = "\n".join(f"Note {i}: Alice Brightwater was born in Lyon in {1900 + i}." for i in range(8))
LONG_DOC = "\n".join(f"Entry {i}: the river city of Marchetti was founded in {1500 + i}."
                     for i in range(60))


# ---- the convention, without a server -----------------------------------------------------

def _messages(*pairs):
    return [Message(role=role, content=content) for role, content in pairs]


def test_documents_are_the_messages_before_the_last_user_message():
    docs, question = split_messages(_messages(
        ("system", "Be brief."), ("user", "doc one"), ("assistant", "doc two"),
        ("user", [{"type": "text", "text": "Where "}, {"type": "text", "text": "is it?"}])))
    assert docs == ["Be brief.", "doc one", "doc two"] and question == "Where is it?"


@pytest.mark.parametrize("pairs,message", [
    ([("user", "only a question")], "no document"),
    ([("system", "doc")], "no user message"),
    ([("user", "doc"), ("user", "Q?"), ("assistant", "A")], "must be the last message"),
    ([("user", "doc"), ("user", "  ")], "is empty"),
    ([("user", [{"type": "image_url", "image_url": {}}]), ("user", "Q?")], "only text"),
])
def test_requests_outside_the_convention_are_400(pairs, message):
    with pytest.raises(ApiError, match=message) as err:
        split_messages(_messages(*pairs))
    assert err.value.status == 400


@pytest.mark.parametrize("body,message", [
    (b"{not json", "malformed JSON body"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"model": "m"}', "messages: Field required"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "n": 2}', "n: "),
    (b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "top_p": 3}', "top_p"),
])
def test_malformed_bodies_are_one_line_400s(body, message):
    with pytest.raises(ApiError, match=message) as err:
        parse_request(body)
    assert err.value.status == 400 and "\n" not in json.dumps(err.value.body())


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(st.binary(max_size=200), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["model", "messages", "role", "content", "stream", "n", "type", "text",
                         "temperature", "top_p", "max_tokens", "seed"]), inner, max_size=5),
    max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_any_body_is_a_request_or_a_400(body):
    try:
        request = parse_request(body)
    except ApiError as exc:
        assert exc.status == 400 and "\n" not in exc.message
        return
    try:
        split_messages(request.messages)
    except ApiError as exc:
        assert exc.status == 400


def test_deeply_nested_json_is_a_400():
    with pytest.raises(ApiError, match="nested too deeply"):
        parse_request(b"[" * 100_000 + b"]" * 100_000)


def test_request_settings_override_the_agent_s():
    req = parse_request(json.dumps({
        "model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0,
        "max_tokens": 7, "seed": 3, "user": "ignored", "logit_bias": {}}).encode())
    assert req.agent_overrides() == {"temperature": 0, "max_final_tokens": 7, "seed": 3}


# ---- a real server process ----------------------------------------------------------------

def _get(url: str, key: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key
                                     else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(url: str, body: bytes, key: str | None = KEY) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    log = tmp_path_factory.mktemp("serve") / "server.log"
    proc, base = start_tiny_server(
        tiny_model_dir, log, KEY, "serve.max_document_tokens=3000",
        "serve.max_request_bytes=60000", "serve.max_concurrent_requests=16")
    yield {"base": base, "proc": proc, "log": log}
    stop_process(proc)


def _client(server, **kw):
    import openai

    return openai.OpenAI(base_url=server["base"] + "/v1", api_key=kw.pop("api_key", KEY), **kw)


def _chat(doc: str = DOC, question: str = "Where was Alice born?"):
    return [{"role": "user", "content": doc}, {"role": "user", "content": question}]


pytestmark = pytest.mark.xdist_group("memrl_serve")


@pytest.mark.slow
def test_plain_request_through_the_openai_client(server):
    reply = _client(server).chat.completions.create(model="tiny", messages=_chat())
    assert reply.object == "chat.completion" and reply.model == "tiny"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason in ("stop", "length")
    extra = reply.model_extra["memrl"]
    assert extra["num_chunks"] == -(-extra["document_tokens"] // 64) > 1
    usage = reply.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens > extra["document_tokens"]  # every prompt of every turn
    models = _client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]


@pytest.mark.slow
def test_streaming_progress_then_the_answer(server):
    events = list(_client(server).chat.completions.create(
        model="tiny", messages=_chat(), stream=True, stream_options={"include_usage": True}))
    progress = [e.model_extra["progress"] for e in events if "progress" in e.model_extra]
    n = progress[-1]["num_chunks"]
    assert [p["chunks_read"] for p in progress] == list(range(1, n + 1)) and n > 1
    deltas = [e.choices[0].delta for e in events if e.choices]
    assert deltas[0].role == "assistant"
    assert all("read chunk" in d.model_extra["reasoning_content"] for d in deltas[1:n + 1])
    assert isinstance(deltas[n + 1].content, str)  # the answer, in one delta
    assert deltas[n + 2].content is None and len(deltas) == n + 3
    assert events[-2].choices[0].finish_reason in ("stop", "length")
    assert events[-1].choices == [] and events[-1].usage.total_tokens > 0
    assert events[-1].model_extra["memrl"]["num_chunks"] == n


@pytest.mark.slow
def test_malformed_bodies_and_unknown_models(server):
    url = server["base"] + "/v1/chat/completions"
    for body, status, message in [
        (b"{not json", 400, "malformed JSON body"),
        (json.dumps({"model": "tiny"}).encode(), 400, "messages: Field required"),
        (json.dumps({"model": "tiny", "messages": _chat()[1:]}).encode(), 400, "no document"),
        (json.dumps({"model": "gpt-4", "messages": _chat()}).encode(), 404, "not served here"),
        (json.dumps({"model": "tiny", "messages": _chat(" \n ")}).encode(), 400,
         "message 1: empty document"),
    ]:
        code, raw = _post(url, body)
        assert code == status, raw
        assert raw.count(b"\n") == 0 and message in json.loads(raw)["error"]["message"], raw
    assert _get(server["base"] + "/nowhere")[0] == 404


@pytest.mark.slow
def test_oversize_documents_and_bodies_are_413(server):
    import openai

    with pytest.raises(openai.APIStatusError) as err:  # about 4,500 tokens in 11 KB
        _client(server, max_retries=0).chat.completions.create(
            model="tiny", messages=_chat("\n".join([LONG_DOC] * 3)))
    assert err.value.status_code == 413 and "more than 3,000 tokens" in str(err.value)
    code, raw = _post(server["base"] + "/v1/chat/completions",
                      json.dumps({"model": "tiny", "messages": _chat("x " * 40000)}).encode())
    assert code == 413 and "over the limit of 60,000 bytes" in json.loads(raw)["error"]["message"]


@pytest.mark.slow
def test_a_wrong_or_missing_key_is_401_and_the_key_is_never_logged(server):
    import openai

    with pytest.raises(openai.AuthenticationError):
        _client(server, api_key="wrong-key", max_retries=0).chat.completions.create(
            model="tiny", messages=_chat())
    assert _post(server["base"] + "/v1/chat/completions", b"{}", key=None)[0] == 401
    assert _get(server["base"] + "/v1/models", key=KEY[:-1])[0] == 401
    assert _get(server["base"] + "/health")[0] == 200  # open to load balancers
    assert KEY not in server["log"].read_text()


@pytest.mark.slow
def test_16_concurrent_requests_are_batched_and_a_17th_is_429(server):
    import openai

    async def run():
        client = openai.AsyncOpenAI(base_url=server["base"] + "/v1", api_key=KEY,
                                    max_retries=0, timeout=300)
        tasks = [asyncio.ensure_future(client.chat.completions.create(
            model="tiny", messages=_chat(LONG_DOC, f"Question {i}?"))) for i in range(16)]
        deadline = time.time() + 120
        while (await asyncio.to_thread(_get, server["base"] + "/health"))[1]["in_flight"] < 16:
            assert time.time() < deadline and not any(t.done() for t in tasks)
            await asyncio.sleep(0.05)
        with pytest.raises(openai.RateLimitError, match="too many requests at once"):
            await client.chat.completions.create(model="tiny", messages=_chat())
        return await asyncio.gather(*tasks)

    replies = asyncio.run(run())
    assert len(replies) == 16 and all(r.choices[0].message.content is not None
                                      for r in replies)
    assert len({r.id for r in replies}) == 16
    health = _get(server["base"] + "/health")[1]
    assert health["in_flight"] == 0
    assert health["batching"]["largest_batch"] > 1  # requests shared forward passes


@pytest.mark.slow
def test_a_client_gone_mid_stream_gives_its_slot_back(server):
    import http.client

    served = _get(server["base"] + "/health")[1]["served"]
    conn = http.client.HTTPConnection("127.0.0.1", int(server["base"].rsplit(":", 1)[1]),
                                      timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "model": "tiny", "messages": _chat(LONG_DOC), "stream": True}),
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")  # the stream has begun
    conn.close()
    deadline = time.time() + 60
    while _get(server["base"] + "/health")[1]["in_flight"] != 0:
        assert time.time() < deadline, "the request's slot was never given back"
        time.sleep(0.05)
    assert _get(server["base"] + "/health")[1]["served"] == served  # stopped, not finished


@pytest.mark.slow
def test_sigterm_finishes_the_request_in_flight_then_exits(server):
    """Last test of the module: it stops the server."""
    proc, events, failure = server["proc"], [], []

    def stream():
        try:
            for event in _client(server).chat.completions.create(
                    model="tiny", messages=_chat(LONG_DOC), stream=True):
                events.append(event)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failure.append(exc)

    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.time() + 120
    while not any("progress" in e.model_extra for e in events):
        assert time.time() < deadline and not failure, failure
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    refused = False
    while not refused and time.time() < deadline:  # no new connection is taken meanwhile
        try:
            _get(server["base"] + "/health")
            time.sleep(0.05)
        except OSError:
            refused = True
    reader.join(timeout=120)
    assert not failure, failure
    assert refused
    progress = [e.model_extra["progress"] for e in events if "progress" in e.model_extra]
    assert progress[-1]["chunks_read"] == progress[-1]["num_chunks"] > 1  # read to the end
    assert events[-1].choices[0].finish_reason in ("stop", "length")
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "Shutting down" in server["log"].read_text()

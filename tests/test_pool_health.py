"""The server pool's health check, on fake vLLM servers (standard-library HTTP servers in
threads that answer like vLLM and can freeze or die): a frozen server is lost within the
documented bound and its requests finish on the live one, a lost server comes back, every
server lost is one error, none reachable at start is a one-line user error (exit 2), and
training refuses servers that cannot reload weights or compute log-probs at temperature 1."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from memrl.cli import main as cli_main
from memrl.errors import MemrlInputError
from memrl.inference import SamplingParams
from memrl.inference.config import OpenAIConfig
from memrl.inference.openai import OpenAIEngine, PoolLostError


class FakeVLLM:
    """A vLLM OpenAI-compatible server as far as the pool sees it: each completion answers
    after `delay` seconds with `max_tokens` copies of token 7; `freeze()` makes every
    endpoint hang (like SIGSTOP: connections are still accepted), `kill()` closes the port."""

    def __init__(self, delay: float = 0.05, *, logprobs_mode: str = "processed_logprobs",
                 dev_mode: bool = True) -> None:
        self.delay = delay
        self.logprobs_mode = logprobs_mode
        self.dev_mode = dev_mode
        self.running = threading.Event()
        self.running.set()
        self.completions = 0
        self.reloads: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                fake.running.wait()
                if self.path == "/health":
                    return self.answer(200, None)
                if self.path == "/v1/models":
                    return self.answer(200, {"data": [{"id": "fake"}]})
                if self.path.startswith("/server_info") and fake.dev_mode:
                    return self.answer(200, {"vllm_config": {"model_config": {
                        "logprobs_mode": fake.logprobs_mode}}})
                self.answer(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.running.wait()
                if self.path == "/v1/completions":
                    time.sleep(fake.delay)
                    fake.running.wait()
                    fake.completions += 1
                    n = body["max_tokens"]
                    return self.answer(200, {"choices": [{"finish_reason": "length", "logprobs": {
                        "tokens": ["token_id:7"] * n, "token_logprobs": [-0.5] * n}}]})
                if self.path == "/collective_rpc" and fake.dev_mode:
                    fake.reloads.append(body["kwargs"]["weights_path"])
                    return self.answer(200, {"results": [None]})
                if self.path == "/reset_prefix_cache" and fake.dev_mode:
                    return self.answer(200, None)
                self.answer(404, {"detail": "Not Found"})

            def answer(self, status: int, payload: object) -> None:
                data = b"" if payload is None else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the pool closed the connection (a request taken back)
                    pass

        self.handler = Handler
        self.port = 0
        self.serve()
        self.url = f"http://127.0.0.1:{self.port}"

    def serve(self) -> None:
        """Listen (again, on the same port after `kill`)."""
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def freeze(self) -> None:
        self.running.clear()

    def thaw(self) -> None:
        self.running.set()

    def kill(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fakes():
    made: list[FakeVLLM] = []

    def make(*args, **kw) -> FakeVLLM:
        made.append(FakeVLLM(*args, **kw))
        return made[-1]

    yield make
    for f in made:
        f.thaw()
        f.kill()


class Lines(list):
    """The pool's lines, each with the time it was said."""

    def __call__(self, text: str) -> None:
        self.append((time.monotonic(), text))

    def matching(self, pattern: str) -> list[tuple[float, str]]:
        return [(t, x) for t, x in self if re.search(pattern, x)]


PARAMS = SamplingParams(max_new_tokens=3, temperature=1.0, seed=5)
HEALTH_S = 1.0
"""health_check_s of the pools here: a frozen server is lost within the stall bound +
2 x this + the monitor's tick (1 s)."""
SLACK_S = 3.0
"""Scheduling slack on a loaded 2-core machine."""


def pool(tokenizer, urls, lines, **options) -> OpenAIEngine:
    cfg = OpenAIConfig(base_urls=urls, max_in_flight_per_server=4, **{
        "timeout_s": 30.0, "health_check_s": HEALTH_S, "progress_s": 0, **options})
    return OpenAIEngine(cfg, tokenizer, notify=lines)


def test_a_frozen_server_is_lost_within_the_bound_and_comes_back(fakes, tiny_tokenizer):
    a, b = fakes(delay=0.2), fakes(delay=0.2)
    lines = Lines()
    gen = pool(tiny_tokenizer, [a.url, b.url], lines, progress_s=0.5)
    assert gen.stall_bound() == 30.0  # no reply yet: the configured timeout
    gen.generate([[1, 2]] * 8, PARAMS)
    bound = gen.stall_bound()  # 4 x the slowest reply (>= 0.2 s), at least health_check_s
    assert max(HEALTH_S, 0.8) <= bound < 30.0
    b.freeze()

    def thaw_when_lost() -> None:
        while not lines.matching("lost"):
            time.sleep(0.02)
        b.thaw()

    threading.Thread(target=thaw_when_lost, daemon=True).start()
    started = time.monotonic()
    out = gen.generate([[1, 2, i] for i in range(60)], PARAMS)
    assert len(out) == 60 and all(g.token_ids == [7, 7, 7] for g in out)
    lost = lines.matching(f"^warning: server {re.escape(b.url)} lost: no reply for")
    assert len(lost) == 1, lines
    # documented bound: stall bound + 2 x health_check_s + the monitor's tick (+ slack)
    assert lost[0][0] - started < bound + 2 * HEALTH_S + 1.0 + SLACK_S
    assert re.search(r"its [1-4] request\(s\) go to 1 live server\(s\)", lost[0][1])
    deadline = time.monotonic() + 10  # the monitor probes it every health_check_s
    while not lines.matching("is back") and time.monotonic() < deadline:
        time.sleep(0.05)
    back = lines.matching(f"^server {re.escape(b.url)} is back after")
    assert len(back) == 1 and back[0][0] > lost[0][0]
    assert lines.matching(r"^pool: \d+ replies in the last \d+ s, \d+ in flight")
    assert gen.stats()[b.url]["down"] is False and gen.stats()[a.url]["failures"] == 0


def test_every_server_lost_is_one_error_and_none_up_at_start_a_user_error(fakes,
                                                                         tiny_tokenizer):
    a, b = fakes(), fakes()
    lines = Lines()
    gen = pool(tiny_tokenizer, [a.url, b.url], lines)
    gen.check_servers()
    assert gen.model == "fake"
    gen.generate([[1]] * 4, PARAMS)
    a.kill()
    b.freeze()
    started = time.monotonic()
    with pytest.raises(PoolLostError, match="every server of the pool is lost") as info:
        gen.generate([[1, i] for i in range(12)], PARAMS)
    assert time.monotonic() - started < gen.stall_bound() + 2 * HEALTH_S + 1.0 + SLACK_S
    assert a.url in str(info.value) and b.url in str(info.value)
    assert "connection refused" in str(info.value)
    assert len(lines.matching("lost")) == 2 and lines.matching("no live server left")

    dead = Lines()
    with pytest.raises(MemrlInputError, match="no server answered") as info:
        pool(tiny_tokenizer, [a.url, "http://127.0.0.1:1"], dead).check_servers()
    assert a.url in str(info.value) and "http://127.0.0.1:1" in str(info.value)


def test_eval_with_no_server_up_is_one_line_exit_2(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval_2.json").write_text("[]")
    args = ["eval", f"model.path={tiny_model_dir}", f"eval.benchmarks=[ruler-hqa={data}]",
            "eval.num_docs=[2]", f"eval.out_dir={tmp_path / 'run'}", "eval.progress=false",
            "rollout.engine=openai",
            "rollout.openai.base_urls=[http://127.0.0.1:1, http://127.0.0.1:2]"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: rollout.openai.base_urls: no server answered"), err
    assert "http://127.0.0.1:1 (connection refused)" in err[0]
    assert "http://127.0.0.1:2 (connection refused)" in err[0]
    assert cli_main([*args, "rollout.openai.timeout_s=0"]) == 2
    assert "rollout.openai.timeout_s" in capsys.readouterr().err
    assert cli_main([*args, "rollout.openai.health_check_s=nan"]) == 2
    assert "rollout.openai.health_check_s" in capsys.readouterr().err


def test_a_returning_server_gets_the_current_weights_first(fakes, tiny_tokenizer, tmp_path):
    a, b = fakes(), fakes()
    policy = torch.nn.Linear(2, 2)
    step = lambda k: str(tmp_path / "w" / f"step_{k:06d}")  # noqa: E731

    # A step's sync: a server that cannot reload is lost; one that answers again is given
    # the new weights and is back (health_check_s 30: the monitor does not probe it first).
    lines = Lines()
    gen = pool(tiny_tokenizer, [a.url, b.url], lines, timeout_s=1.0, health_check_s=30.0,
               weights_dir=str(tmp_path / "w"))
    gen.sync_weights(policy, 0)
    assert a.reloads == b.reloads == [step(0)]
    b.kill()
    gen.sync_weights(policy, 1)
    assert lines.matching(f"^warning: server {re.escape(b.url)} lost: could not reload the "
                          "weights of step 1: connection refused")
    assert a.reloads == [step(0), step(1)] and gen.stats()[b.url]["down"]
    b.serve()
    gen.sync_weights(policy, 2)
    assert b.reloads == [step(0), step(2)]
    assert lines.matching(f"^server {re.escape(b.url)} is back after .* \\(weights of step 2 "
                          "reloaded\\)")
    assert [p.name for p in (tmp_path / "w").iterdir()] == ["step_000002"]
    gen.close()

    # Between steps: the monitor probes a lost server every health_check_s, with no request
    # running, and brings it back with the current step's weights.
    lines = Lines()
    gen = pool(tiny_tokenizer, [a.url, b.url], lines, timeout_s=1.0,
               weights_dir=str(tmp_path / "w"))
    gen.sync_weights(policy, 3)
    b.kill()
    gen.generate([[1]] * 8, PARAMS)  # b refuses connections: lost
    assert gen.stats()[b.url]["lost"] == "connection refused"
    b.reloads.clear()
    b.serve()
    deadline = time.monotonic() + 10
    while not lines.matching("is back") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines.matching(f"^server {re.escape(b.url)} is back after ")
    assert b.reloads == [step(3)]
    completed = b.completions
    gen.generate([[1, i] for i in range(16)], PARAMS)
    assert b.completions > completed  # it takes requests again
    gen.close()


def test_training_needs_dev_mode_and_processed_logprobs(fakes, tiny_tokenizer):
    raw, plain = fakes(logprobs_mode="raw_logprobs"), fakes(dev_mode=False)
    with pytest.raises(MemrlInputError, match="--logprobs-mode processed_logprobs"):
        pool(tiny_tokenizer, [raw.url], Lines()).check_servers(training=True)
    with pytest.raises(MemrlInputError, match="VLLM_SERVER_DEV_MODE=1"):
        pool(tiny_tokenizer, [plain.url], Lines()).check_servers(training=True)
    pool(tiny_tokenizer, [raw.url], Lines()).check_servers()  # evaluation uses no log-probs

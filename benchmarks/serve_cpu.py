"""`memrl serve` throughput with the tiny model on a CPU, at 1, 4 and 16 concurrent clients.

Starts `memrl serve` as a process (HF engine behind its batching queue), then for each
concurrency level c sends --requests requests, c at a time, through the official `openai`
client (each request: one document of about --doc-tokens tokens and a question), and prints
requests/s, document tokens/s and processed tokens/s (the `usage` the server reports: every
prompt and response token of every turn), with the batching the server did (/health).

    python benchmarks/serve_cpu.py                       # c = 1, 4, 16; ~5 min
    python benchmarks/serve_cpu.py --concurrency 1 16 --requests 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ask_cpu import write_document  # noqa: E402
from gpu_common import free_port  # noqa: E402


def health(base: str) -> dict:
    with urllib.request.urlopen(base + "/health", timeout=30) as response:
        return json.loads(response.read())


async def level(base: str, document: str, concurrency: int, requests: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", timeout=3600,
                                max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int):
        async with gate:
            return await client.chat.completions.create(model="tiny", messages=[
                {"role": "user", "content": document},
                {"role": "user", "content": f"Question {i}: who founded the university?"}])

    before = health(base)["batching"]
    start = time.perf_counter()
    replies = await asyncio.gather(*(one(i) for i in range(requests)))
    wall = time.perf_counter() - start
    after = health(base)["batching"]
    calls = after["calls"] - before["calls"]
    answered = after["requests"] - before["requests"]
    return {
        "concurrency": concurrency, "requests": requests, "wall_s": wall,
        "requests_per_s": requests / wall,
        "document_tokens_per_s": sum(r.model_extra["memrl"]["document_tokens"]
                                     for r in replies) / wall,
        "processed_tokens_per_s": sum(r.usage.total_tokens for r in replies) / wall,
        "turns_per_generate_call": answered / calls if calls else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=16, help="requests per level")
    parser.add_argument("--doc-tokens", type=int, default=4000)
    parser.add_argument("--chunk-size", type=int, default=1000)
    parser.add_argument("--max-memory-tokens", type=int, default=64)
    parser.add_argument("--max-final-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the server (OMP_NUM_THREADS)")
    parser.add_argument("--work", type=Path,
                        default=Path(tempfile.gettempdir()) / "memrl_serve_cpu")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    model = args.work / "tiny"
    if not (model / "config.json").exists():
        from memrl.models.tiny import build_tiny_model

        build_tiny_model(model, seed=0)
    doc = args.work / "doc.txt"
    write_document(doc, args.doc_tokens, AutoTokenizer.from_pretrained(model))
    port = free_port()
    cmd = [sys.executable, "-m", "memrl", "serve", "--model", str(model), f"serve.port={port}",
           "serve.served_model_name=tiny", f"memagent.chunk_size={args.chunk_size}",
           f"memagent.max_memory_tokens={args.max_memory_tokens}",
           f"memagent.max_final_tokens={args.max_final_tokens}", "seed=0",
           "serve.log_level=warning"]
    import torch

    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# {os.cpu_count()} CPUs, Python {platform.python_version()}, torch "
          f"{torch.__version__}")
    print("$ memrl " + " ".join(cmd[3:]), flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    proc = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                health(base)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.3)
        document = doc.read_text()
        rows = [asyncio.run(level(base, document, c, args.requests)) for c in args.concurrency]
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    print(f"\n{args.requests} requests per level, each a document of "
          f"{rows[0]['document_tokens_per_s'] * rows[0]['wall_s'] / args.requests:,.0f} tokens")
    print("| concurrent clients | wall (s) | requests/s | document tokens/s | "
          "processed tokens/s | turns per forward batch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['wall_s']:.1f} | {r['requests_per_s']:.3f} | "
              f"{r['document_tokens_per_s']:,.0f} | {r['processed_tokens_per_s']:,.0f} | "
              f"{r['turns_per_generate_call']:.1f} |")


if __name__ == "__main__":
    main()

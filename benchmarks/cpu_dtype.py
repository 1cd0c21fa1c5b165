"""What bounds MemAgent reading on a CPU: prefill of one chunk's prompt and decoding of the
memory, per dtype and torch thread count, and the document tokens/s they allow.

One MemAgent turn reads a chunk: the prompt (template + memory + chunk) is prefilled, then
the new memory is decoded token by token. So with chunks of C tokens, a prompt of P tokens
prefilled in p seconds and a memory of M tokens decoded at d seconds each, reading runs at
C / (p + M·d) document tokens/s. This script measures p and d on the in-process engine
`memrl ask` uses (HFEngine, greedy, EOS ignored so every run decodes the same number of
tokens), for each --dtypes and --threads, --repeats times each, and prints the medians of
wall time and of process CPU time (user + system: with one thread, the work done however
busy the cores are; with more, OpenMP's waiting is counted too), then the document tokens/s
for --memory-tokens memories.

    python benchmarks/cpu_dtype.py --model DIR --document /usr/share/common-licenses/GPL-3

DIR: e.g. `memrl init-model smollm2-135m-instruct DIR`. The prompt is the document's first
--prompt-tokens tokens (the length of a 512-token chunk's MemAgent prompt with a memory).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(engine, prompt: list[int], decode_tokens: int, repeats: int) -> dict[str, float]:
    """Medians over `repeats` (after one warm-up) of prefill and per-token decode times."""
    from memrl.inference.base import SamplingParams

    def run(n: int):
        params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
        return lambda: engine.generate([prompt], params)

    run(decode_tokens + 1)()  # warm-up
    pre, full = [], []
    for _ in range(repeats):
        pre.append(timed(run(1)))
        full.append(timed(run(decode_tokens + 1)))
    out = {}
    for i, kind in enumerate(("wall", "cpu")):
        prefill = statistics.median(p[i] for p in pre)
        out[f"prefill_{kind}"] = prefill
        out[f"decode_{kind}"] = max(statistics.median(f[i] for f in full) - prefill,
                                    0.0) / decode_tokens
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--document", type=Path, required=True)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--prompt-tokens", type=int, default=800)
    parser.add_argument("--chunk-size", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--memory-tokens", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    import transformers

    from memrl.inference.hf import HFEngine
    from memrl.inference.loader import cpu_compute_dtype, cpu_flags, load_pretrained

    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), transformers "
          f"{transformers.__version__}; bf16 flags: "
          f"{sorted(f for f in cpu_flags() if 'bf16' in f) or 'none'}; auto dtype: "
          f"{cpu_compute_dtype()}; load average {os.getloadavg()[0]:.1f}")
    print(f"| dtype | threads | prefill {args.prompt_tokens} tokens: wall (CPU) s | decode "
          "ms/token: wall (CPU) | " + " | ".join(
              f"doc tokens/s, M={m}" for m in args.memory_tokens) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(args.memory_tokens))
    for dtype in args.dtypes:
        model, tokenizer = load_pretrained(str(args.model), device="cpu", dtype=dtype)
        engine = HFEngine(model, tokenizer)
        text = args.document.read_text(encoding="utf-8", errors="replace")
        prompt = tokenizer.encode(text, add_special_tokens=False)[: args.prompt_tokens]
        for threads in args.threads:
            torch.set_num_threads(threads)
            r = measure(engine, prompt, args.decode_tokens, args.repeats)
            rates = [args.chunk_size / (r["prefill_wall"] + m * r["decode_wall"])
                     for m in args.memory_tokens]
            print(f"| {dtype} | {threads} | {r['prefill_wall']:.2f} ({r['prefill_cpu']:.2f}) "
                  f"| {r['decode_wall'] * 1e3:.0f} ({r['decode_cpu'] * 1e3:.0f}) | "
                  + " | ".join(f"{x:,.0f}" for x in rates) + " |", flush=True)
        del engine, model
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

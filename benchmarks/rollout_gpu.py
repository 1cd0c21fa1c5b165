"""Rollout throughput: memrl's HF engine against memrl's vLLM engine, same workload, one run.

MemAgent-shaped generation on a causal LM with Qwen2.5-0.5B's shape and random weights
(nothing is downloaded): batches of B prompts of P random tokens, each answered with exactly
N new tokens (`SamplingParams.ignore_eos`: a random model would stop at a random EOS),
temperature 1, log-probs of every token on. The cases default to P ∈ {1024, 6144} ×
B ∈ {64, 256}, N = 256. Both engines get the same prompts, through memrl's public engines:
`memrl.inference.HFEngine` (bf16 weights, micro-batches of `--hf-batch-size`) and
`memrl.inference.VLLMEngine` (the colocated in-process engine the recipe uses). Also timed:
weight sync policy → engine (`VLLMEngine.sync_weights` from the bf16 HF module), and
vLLM's sleep / wake (level 1; GPU only).

    python benchmarks/rollout_gpu.py --out rollout.json                 # GPU, ~4 min on an H100
    python benchmarks/rollout_gpu.py --no-hf --cases 6144x256           # vLLM only, one case
    python benchmarks/rollout_gpu.py --no-hf --unseeded                 # per-request seeds' cost
    python benchmarks/rollout_gpu.py --tiny --out /tmp/rollout.json     # CPU smoke check

The memory-bandwidth bound printed with each case (`--hbm-tbps`, 3.35 TB/s = H100 SXM):
every decode step reads all weights once (the batch shares them) plus every sequence's KV
cache. With W = parameters · 2 bytes (bf16; tied embeddings read once, by the output
projection) and K = 2 · layers · kv_heads · head_dim · 2 bytes of KV cache per token
(keys and values; 12,288 bytes for the 0.5B shape), step t (t = 0 … N-1) reads
W + B · K · (P + t) bytes, so the whole decode reads

    bytes = N · W + B · K · (N · P + N · (N - 1) / 2)
    step_time_min = bytes / HBM bandwidth          tokens/s bound = B · N / step_time_min

("decode bound"; it treats the prefill's last position as decode step 0, which changes the
bound by under 0.5%). The measured time also contains the prefill, which is compute-bound:
the "with prefill" bound adds B · (2 · N_body · P + 2 · layers · P² · hidden) FLOPs at
`--peak-tflops` (989 = H100 SXM dense bf16), with N_body = parameters − vocab · hidden (the
prompt positions need no output projection; attention counted causally). Fractions of both
bounds are printed; the acceptance target of issue 14 reads the decode bound.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (  # noqa: E402
    QWEN25_05B,
    TINY,
    CaseTimeout,
    environment,
    gpu_memory_used_gib,
    print_environment,
    random_model_dir,
    run_record,
    time_limit,
    write_summary,
)

DEFAULT_CASES = "1024x64,1024x256,6144x64,6144x256"
TINY_CASES = "48x4,96x8"


# ---------------------------------------------------------------------------------- the bound
def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_value: int = 2
                       ) -> int:
    """Bytes of KV cache one token holds: keys and values of every layer and KV head."""
    return 2 * layers * kv_heads * head_dim * bytes_per_value


def decode_bytes(batch: int, prompt_len: int, new_tokens: int, weight_bytes: float,
                 kv_per_token: float) -> float:
    """Bytes the decode reads: N · W + B · K · (N · P + N · (N − 1) / 2) (module docstring)."""
    n = new_tokens
    return n * weight_bytes + batch * kv_per_token * (n * prompt_len + n * (n - 1) / 2)


def prefill_flops(batch: int, prompt_len: int, body_params: float, layers: int,
                  hidden: int) -> float:
    """B · (2 · N_body · P + 2 · layers · P² · hidden): matmuls plus causal attention."""
    return batch * (2 * body_params * prompt_len + 2 * layers * prompt_len**2 * hidden)


def rollout_bound(batch: int, prompt_len: int, new_tokens: int, *, params: int, layers: int,
                  hidden: int, kv_heads: int, head_dim: int, vocab: int, hbm_tbps: float,
                  peak_tflops: float) -> dict[str, float]:
    """New tokens/s allowed by memory bandwidth (decode) and by compute (prefill) for one case."""
    weight_bytes = 2.0 * params
    kv = kv_bytes_per_token(layers, kv_heads, head_dim)
    decode_s = decode_bytes(batch, prompt_len, new_tokens, weight_bytes, kv) / (hbm_tbps * 1e12)
    prefill_s = prefill_flops(batch, prompt_len, params - vocab * hidden, layers, hidden) / (
        peak_tflops * 1e12)
    tokens = batch * new_tokens
    return {"decode_step_time_min_ms": 1e3 * decode_s / new_tokens,
            "bound_decode_tok_s": tokens / decode_s,
            "prefill_time_min_s": prefill_s,
            "bound_with_prefill_tok_s": tokens / (decode_s + prefill_s)}


# ---------------------------------------------------------------------------------- cases
def parse_cases(text: str) -> list[tuple[int, int]]:
    """'1024x64,6144x256' → [(1024, 64), (6144, 256)]: (prompt tokens, batch)."""
    cases = []
    for item in text.split(","):
        try:
            prompt, batch = (int(x) for x in item.strip().lower().split("x"))
        except ValueError:
            raise SystemExit(f"bad case {item!r}: write PROMPTxBATCH, e.g. 1024x64") from None
        if prompt < 1 or batch < 1:
            raise SystemExit(f"bad case {item!r}: prompt and batch must be positive")
        cases.append((prompt, batch))
    return cases


def case_name(prompt: int, batch: int) -> str:
    return f"{prompt}x{batch}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.add_argument("--tiny", action="store_true", help="tiny model and cases (CPU smoke check)")
    p.add_argument("--cases", default=None,
                   help=f"PROMPTxBATCH,... (default {DEFAULT_CASES}; tiny {TINY_CASES})")
    p.add_argument("--hf-cases", default=None,
                   help="cases also run on the HF engine (default: all of --cases)")
    p.add_argument("--no-hf", action="store_true", help="skip the HF engine")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM engine")
    p.add_argument("--new-tokens", type=int, default=None, help="new tokens per prompt "
                   "(default 256; tiny 8)")
    p.add_argument("--hf-batch-size", type=int, default=64,
                   help="HF engine micro-batch (256 prompts of 6K tokens at once run out of "
                        "memory on 80 GB)")
    p.add_argument("--case-timeout", type=float, default=150.0,
                   help="seconds one engine may take for one case (0: no limit)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.6,
                   help="vLLM's share of the GPU (the HF engine's KV cache needs the rest)")
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs")
    p.add_argument("--repeats", type=int, default=1,
                   help="vLLM runs per case (the first may include lazy initialisation)")
    p.add_argument("--sync-repeats", type=int, default=3, help="timed weight syncs")
    p.add_argument("--hbm-tbps", type=float, default=3.35,
                   help="HBM bandwidth in TB/s for the bound (H100 SXM 3.35, H200 4.8)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="dense bf16 TFLOP/s for the prefill part of the bound (H100 SXM 989)")
    p.add_argument("--unseeded", action="store_true",
                   help="requests without seeds. memrl seeds every request (reproducible "
                        "rollouts); vLLM then samples seeded rows one by one (one kernel per "
                        "request per step), unseeded ones in one kernel: this shows the cost")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="where the model is written (default: a "
                   "temporary directory, removed at the end)")
    args = p.parse_args(argv)
    args.cases = parse_cases(args.cases or (TINY_CASES if args.tiny else DEFAULT_CASES))
    args.hf_cases = (set() if args.no_hf else
                     set(parse_cases(args.hf_cases)) if args.hf_cases else set(args.cases))
    if args.new_tokens is None:
        args.new_tokens = 8 if args.tiny else 256
    if args.new_tokens < 1 or args.repeats < 1 or args.hf_batch_size < 1:
        p.error("--new-tokens, --repeats and --hf-batch-size must be positive")
    return args


# ---------------------------------------------------------------------------------- timing
def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Any) -> tuple[Any, float]:
    synchronize()
    t0 = time.perf_counter()
    out = fn()
    synchronize()
    return out, time.perf_counter() - t0


def random_prompts(batch: int, length: int, low: int, high: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(length)] for _ in range(batch)]


def run_engine(engine: Any, prompts: list[list[int]], params: Any, timeout: float
               ) -> dict[str, Any]:
    """One timed generate call: new tokens, seconds, tokens/s, or why it did not finish."""
    import torch

    try:
        with time_limit(timeout):
            gens, seconds = timed(lambda: engine.generate(prompts, params))
    except CaseTimeout as exc:
        return {"status": "timeout", "error": str(exc)}
    except torch.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        return {"status": "oom", "error": str(exc).splitlines()[0]}
    tokens = sum(len(g.token_ids) for g in gens)
    exact = all(len(g.token_ids) == params.max_new_tokens == len(g.logprobs) for g in gens)
    return {"status": "ok", "seconds": seconds, "new_tokens": tokens,
            "tokens_per_s": tokens / seconds, "all_exactly_max_new_tokens": exact}


def weight_sync_and_sleep(engine: Any, policy: Any, repeats: int) -> dict[str, Any]:
    """Seconds of `sync_weights` (policy → engine), `sleep`, `wake`, and a sync after waking;
    GPU memory in use (all allocators) awake and asleep."""
    out: dict[str, Any] = {}
    syncs = [timed(lambda i=i: engine.sync_weights(policy, i))[1] for i in range(repeats)]
    out["sync_s"] = syncs
    out["sync_s_median"] = statistics.median(syncs)
    out["gpu_used_awake_gib"] = gpu_memory_used_gib()
    if not engine.on_gpu:
        out["sleep"] = "no sleep mode on CPU (sleep / wake are no-ops)"
        return out
    out["sleep_s"] = timed(engine.sleep)[1]
    out["gpu_used_asleep_gib"] = gpu_memory_used_gib()
    out["wake_s"] = timed(engine.wake)[1]
    out["sync_after_wake_s"] = timed(lambda: engine.sync_weights(policy, repeats))[1]
    out["gpu_used_after_wake_gib"] = gpu_memory_used_gib()
    return out


# ---------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with run_record(args.out, "rollout_gpu", args, engine="hf" if args.no_vllm else "vllm"):
        return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from memrl.inference import HFEngine, SamplingParams, VLLMConfig, load_pretrained

    env = environment()
    print_environment(env)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = dict(TINY if args.tiny else QWEN25_05B)
    max_prompt = max(p for p, _ in args.cases)
    if max_prompt + args.new_tokens > shape["max_position_embeddings"]:
        shape["max_position_embeddings"] = max_prompt + args.new_tokens
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="memrl_rollout_")
    work = Path(args.work_dir or tmp.name)
    model_dir = work / "model"
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    model_info = random_model_dir(model_dir, shape, tiny=args.tiny, seed=args.seed,
                                  device=device)
    timing["build_model_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # The policy the engines serve: bf16 on GPU (as vLLM runs), float32 on CPU.
    policy, tokenizer = load_pretrained(model_dir, device=device)
    timing["load_hf_s"] = time.perf_counter() - t0
    hf = HFEngine(policy, tokenizer, generation_batch_size=args.hf_batch_size)
    engine = None
    if not args.no_vllm:
        t0 = time.perf_counter()
        from memrl.inference import VLLMEngine

        engine = VLLMEngine(model_dir, tokenizer, VLLMConfig(
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=max_prompt + args.new_tokens,
            max_num_seqs=max(b for _, b in args.cases),
            enforce_eager=args.enforce_eager, seed=args.seed,
            kv_cache_memory_bytes=None if device == "cuda" else 1 << 28))
        timing["vllm_startup_s"] = time.perf_counter() - t0
        print(f"vLLM engine up in {timing['vllm_startup_s']:.1f} s", flush=True)

    sync = weight_sync_and_sleep(engine, policy, args.sync_repeats) if engine else {}
    low = model_info["tokenizer_bpe_tokens"]  # placeholder tokens: never special
    high = model_info["tokenizer_tokens"]
    if high - low < 2:
        low = 0
    warm = random_prompts(4, 16, low, high, args.seed + 999)
    warm_params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=1, ignore_eos=True)
    for eng in (hf, engine):
        if eng is not None:
            timing[f"warmup_{'hf' if eng is hf else 'vllm'}_s"] = timed(
                lambda e=eng: e.generate(warm, warm_params))[1]

    cases = run_cases(args, hf, engine, shape, model_info, token_range=(low, high))

    summary = {
        "benchmark": "memrl rollout: HF engine vs vLLM engine",
        "environment": env,
        "model": model_info,
        "settings": {"new_tokens": args.new_tokens, "temperature": 1.0, "top_p": 1.0,
                     "ignore_eos": True, "logprobs": True,
                     "seeded_requests": not args.unseeded,
                     "hf_batch_size": args.hf_batch_size, "hf_dtype": str(policy.dtype),
                     "gpu_memory_utilization": args.gpu_memory_utilization,
                     "enforce_eager": args.enforce_eager, "repeats": args.repeats,
                     "case_timeout_s": args.case_timeout, "hbm_tbps": args.hbm_tbps,
                     "peak_tflops": args.peak_tflops},
        "timing_s": timing,
        "weight_sync_and_sleep": sync,
        "cases": cases,
    }
    print_summary(summary)
    write_summary(summary, args.out)
    if tmp is not None:
        tmp.cleanup()
    return summary


def run_cases(args: argparse.Namespace, hf: Any, engine: Any, shape: dict[str, int],
              model_info: dict[str, Any], *, token_range: tuple[int, int]
              ) -> list[dict[str, Any]]:
    """Every `--cases` entry (prompt length, batch) on vLLM (`--repeats` times; skipped once
    a case did not end ok) and, for `--hf-cases`, on the HF engine: random prompts of ids in
    `token_range`, the rows with their roofline bounds, each printed as it ends."""
    from memrl.inference import SamplingParams

    low, high = token_range
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    cases = []
    vllm_broken = None
    for i, (prompt_len, batch) in enumerate(args.cases):
        name = case_name(prompt_len, batch)
        prompts = random_prompts(batch, prompt_len, low, high, args.seed * 1000 + i)
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0,
                                seed=None if args.unseeded else args.seed + i,
                                ignore_eos=True)
        row: dict[str, Any] = {"case": name, "prompt_tokens": prompt_len, "batch": batch,
                               "new_tokens_each": args.new_tokens}
        row.update(rollout_bound(
            batch, prompt_len, args.new_tokens, params=model_info["params"],
            layers=shape["num_hidden_layers"], hidden=shape["hidden_size"],
            kv_heads=shape["num_key_value_heads"], head_dim=head_dim,
            vocab=shape["vocab_size"], hbm_tbps=args.hbm_tbps, peak_tflops=args.peak_tflops))
        if engine is not None:
            if vllm_broken:
                row["vllm"] = [{"status": "skipped", "error": vllm_broken}]
            else:
                row["vllm"] = [run_engine(engine, prompts, params, args.case_timeout)
                               for _ in range(args.repeats)]
                if row["vllm"][-1]["status"] != "ok":
                    vllm_broken = f"an earlier case ended with {row['vllm'][-1]['status']}"
        if (prompt_len, batch) in args.hf_cases:
            row["hf"] = run_engine(hf, prompts, params, args.case_timeout)
        summarize_case(row)
        cases.append(row)
        print(case_line(row), flush=True)
    return cases


def summarize_case(row: dict[str, Any]) -> None:
    """Best vLLM run, the vLLM / HF ratio and the fractions of the bounds."""
    ok = [r for r in row.get("vllm", []) if r["status"] == "ok"]
    if ok:
        best = max(r["tokens_per_s"] for r in ok)
        row["vllm_tokens_per_s"] = best
        row["vllm_fraction_of_decode_bound"] = best / row["bound_decode_tok_s"]
        row["vllm_fraction_of_bound_with_prefill"] = best / row["bound_with_prefill_tok_s"]
    hf = row.get("hf")
    if hf and hf["status"] == "ok":
        row["hf_tokens_per_s"] = hf["tokens_per_s"]
        row["hf_fraction_of_decode_bound"] = hf["tokens_per_s"] / row["bound_decode_tok_s"]
        if ok:
            row["vllm_over_hf"] = row["vllm_tokens_per_s"] / hf["tokens_per_s"]


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def case_line(row: dict[str, Any]) -> str:
    hf = row.get("hf", {})
    vllm = row.get("vllm", [{}])[-1]
    return (f"case {row['case']}: vLLM {fmt(row.get('vllm_tokens_per_s'), ',.0f')} tok/s "
            f"({vllm.get('status', 'not run')}), HF {fmt(row.get('hf_tokens_per_s'), ',.0f')} "
            f"tok/s ({hf.get('status', 'not run')}), ratio {fmt(row.get('vllm_over_hf'), '.1f')}"
            f"x; decode bound {row['bound_decode_tok_s']:,.0f} tok/s, vLLM at "
            f"{fmt(row.get('vllm_fraction_of_decode_bound'), '.1%')}")


def print_summary(summary: dict[str, Any]) -> None:
    print("\ncase | vLLM tok/s | HF tok/s | vLLM/HF | decode bound tok/s | vLLM % bound | "
          "bound w/ prefill | vLLM % of it")
    for row in summary["cases"]:
        print(" | ".join([
            row["case"], fmt(row.get("vllm_tokens_per_s"), ",.0f"),
            fmt(row.get("hf_tokens_per_s"), ",.0f"), fmt(row.get("vllm_over_hf"), ".1f"),
            f"{row['bound_decode_tok_s']:,.0f}",
            fmt(row.get("vllm_fraction_of_decode_bound"), ".1%"),
            f"{row['bound_with_prefill_tok_s']:,.0f}",
            fmt(row.get("vllm_fraction_of_bound_with_prefill"), ".1%")]))
    s = summary["weight_sync_and_sleep"]
    if s:
        print(f"weight sync (policy → engine): median {s['sync_s_median']:.3f} s of "
              f"{len(s['sync_s'])}; " + (
                  f"sleep {s['sleep_s']:.2f} s, wake {s['wake_s']:.2f} s, sync after wake "
                  f"{s['sync_after_wake_s']:.3f} s; GPU used awake "
                  f"{s['gpu_used_awake_gib']:.1f} GiB, asleep {s['gpu_used_asleep_gib']:.1f} GiB"
                  if "sleep_s" in s else s.get("sleep", "")))
    t = summary["timing_s"]
    print("timing: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()), flush=True)


if __name__ == "__main__":  # the guard vLLM's engine processes need
    main()

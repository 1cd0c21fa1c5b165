"""Linear cost: MemAgent evaluation time and memory against document length, next to a
full-context forward pass.

memrl's own `memrl.agents.memagent.MemAgent` reads synthetic documents of growing length
(7K, 14K, 28K, 56K tokens by default: doubling up to `--max-tokens`; or `--lengths`) chunk
by chunk with memrl's colocated vLLM engine (`memrl.inference.VLLMEngine`), on a causal
LM with Qwen2.5-0.5B's shape and random weights (nothing is downloaded): 5000-token chunks,
a few questions per length read together (async episodes, as `memrl eval` runs them on
vLLM: each question's next chunk goes out as soon as its previous memory is back).

    python benchmarks/linear_cost_gpu.py --out linear.json              # GPU, ~4 min on an H100
    python benchmarks/linear_cost_gpu.py --lengths 7000,56000,448000,3584000 \\
        --memory-tokens 64 --final-tokens 16 --questions 2 --case-timeout 400 \\
        --out long.json                                                 # up to 3.5M, ~7 min
    python benchmarks/linear_cost_gpu.py --tiny --out /tmp/linear.json  # CPU smoke check

Every memory update writes exactly `--memory-tokens` tokens: a random-weight model never
emits EOS reliably (probability ~1/151,936 per token, so a few updates would stop early at
random), so the engine is driven with `SamplingParams.ignore_eos` through a thin wrapper
(`FixedLengthReplies`); the tokenizer is padded to the model's vocabulary (as in
`train_step_gpu.py`), so a memory of N sampled tokens re-encodes to about N tokens and every
update prompt has the same size (chunk + memory + template). Cost per chunk is then flat by
construction of the algorithm, which is what this measures: it must not grow with the
document.

Recorded per length: the wall time of each chunk step (mean, standard deviation, min, max,
coefficient of variation; the first step's memory is "No previous memory", so it is also
reported without it), the final-answer step, the total, and memory. GPU memory: vLLM
preallocates its KV cache (`--gpu-memory-utilization` of the card) when it starts, so
`torch.cuda.max_memory_allocated` says nothing about what a length needs; the script
records the GPU memory in use by every allocator (`torch.cuda.mem_get_info`) after each
length, and the longest prompt + reply in tokens, which is what the KV cache must hold per
question (flat when memory is flat).

The baseline is one Hugging Face forward pass over the whole document (+ question) at
once: prefill only, no generation, bf16, logits for the last position only; its time and
`torch.cuda.max_memory_allocated` per length, until it runs out of memory, passes
`--baseline-max-tokens`, or is predicted (quadratic attention: the previous time × (length
ratio)²) to exceed `--case-timeout`. It runs before vLLM starts, so it has the whole GPU.
`linear_cost.png` plots the total time of both against document length.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memrl.inference.base import SamplingParams

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


# ---------------------------------------------------------------------------------- maths
def doubling_lengths(start: int, stop: int) -> list[int]:
    """start, 2·start, 4·start, … while ≤ stop."""
    if start < 1 or stop < start:
        raise SystemExit(f"need 1 <= --min-tokens ({start}) <= --max-tokens ({stop})")
    out = [start]
    while out[-1] * 2 <= stop:
        out.append(out[-1] * 2)
    return out


def spread(values: list[float]) -> dict[str, float]:
    """Mean, population standard deviation, min, max and coefficient of variation."""
    mean = statistics.fmean(values)
    std = statistics.pstdev(values)
    return {"mean": mean, "std": std, "min": min(values), "max": max(values),
            "cv": std / mean if mean else 0.0, "n": len(values)}


def max_relative_deviation(values: list[float]) -> float:
    """max |v / mean(values) − 1|: 0.15 means every value is within ±15% of the mean."""
    mean = statistics.fmean(values)
    return max(abs(v / mean - 1) for v in values)


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares y = slope · x + intercept, and R²."""
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx if sxx else 0.0
    intercept = my - slope * mx
    ss_res = sum((y - slope * x - intercept) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    r2 = 1 - ss_res / ss_tot if ss_tot else 1.0
    return {"slope": slope, "intercept": intercept, "r2": r2, "points": n}


# ---------------------------------------------------------------------------------- engine
class FixedLengthReplies:
    """A Generator over an engine whose every reply runs to max_new_tokens (`ignore_eos`)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.continuous_batching = getattr(engine, "continuous_batching", False)
        """Episodes run as coroutines (`agenerate`) where the engine batches continuously,
        as `memrl eval` runs them."""

    def generate(self, prompts: Any, params: Any) -> Any:
        if isinstance(params, SamplingParams):
            return self.engine.generate(prompts, dataclasses.replace(params, ignore_eos=True))
        return self.engine.generate(
            prompts, [dataclasses.replace(p, ignore_eos=True) for p in params])

    async def agenerate(self, prompt: Any, params: SamplingParams) -> Any:
        return await self.engine.agenerate(prompt, dataclasses.replace(params, ignore_eos=True))


# ---------------------------------------------------------------------------------- args
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.add_argument("--plot", default=None,
                   help="plot path (default: linear_cost.png next to --out, else in the cwd)")
    p.add_argument("--tiny", action="store_true", help="tiny model and lengths (CPU smoke check)")
    p.add_argument("--lengths", default=None, help="comma-separated document lengths in tokens "
                   "(overrides --min-tokens/--max-tokens)")
    p.add_argument("--min-tokens", type=int, default=None, help="first length (default 7000)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="last length, doubling from --min-tokens "
                        "(default 56000; 3584000 = 7000·2⁹)")
    p.add_argument("--questions", type=int, default=None, help="questions per length (default 4)")
    p.add_argument("--chunk-size", type=int, default=None, help="default 5000")
    p.add_argument("--memory-tokens", type=int, default=None,
                   help="tokens every memory update writes (default 1024)")
    p.add_argument("--final-tokens", type=int, default=None, help="final answer tokens (32)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs")
    p.add_argument("--case-timeout", type=float, default=120.0,
                   help="seconds one length may take, per engine (0: no limit)")
    p.add_argument("--no-baseline", action="store_true", help="skip the full-context baseline")
    p.add_argument("--baseline-max-tokens", type=int, default=1_000_000,
                   help="longest document the baseline tries")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="where the model is written (default: a "
                   "temporary directory, removed at the end)")
    args = p.parse_args(argv)
    defaults = ({"min_tokens": 300, "max_tokens": 600, "questions": 2, "chunk_size": 128,
                 "memory_tokens": 16, "final_tokens": 4} if args.tiny else
                {"min_tokens": 7000, "max_tokens": 56_000, "questions": 4, "chunk_size": 5000,
                 "memory_tokens": 1024, "final_tokens": 32})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.lengths:
        try:
            args.lengths = sorted({int(x) for x in args.lengths.split(",")})
        except ValueError:
            p.error(f"--lengths must be integers, got {args.lengths!r}")
        if args.lengths[0] < 1:
            p.error("--lengths must be positive")
    else:
        args.lengths = doubling_lengths(args.min_tokens, args.max_tokens)
    if min(args.questions, args.chunk_size, args.memory_tokens, args.final_tokens) < 1:
        p.error("--questions, --chunk-size, --memory-tokens and --final-tokens must be >= 1")
    return args


# ---------------------------------------------------------------------------------- data
def documents(lengths: list[int], questions: int, tokenizer: Any, seed: int
              ) -> dict[int, list[Any]]:
    """Per target length, `questions` synthetic records whose context has about that many
    tokens (paragraph count from the tokens per paragraph of a sample)."""
    from memrl.data.synthetic import make_synthetic_records

    sample = make_synthetic_records(1, num_docs=200, seed=seed + 7)[0]
    per_doc = len(tokenizer.encode(sample.render_context(), add_special_tokens=False)) / 200
    out = {}
    for i, length in enumerate(lengths):
        num_docs = max(2, math.ceil(length / per_doc))
        out[length] = make_synthetic_records(questions, num_docs=num_docs, seed=seed + 1000 + i)
    return out


# ---------------------------------------------------------------------------------- baseline
def baseline(model_dir: Path, records: dict[int, list[Any]], args: argparse.Namespace,
             device: str) -> list[dict[str, Any]]:
    """One forward pass over each length's first document + question, until it fails."""
    import torch

    from memrl.inference import load_pretrained

    model, tokenizer = load_pretrained(model_dir, device=device)
    cuda = device == "cuda"
    rows: list[dict[str, Any]] = []
    previous: tuple[int, float] | None = None
    stop_reason = None
    for length, recs in records.items():
        rec = recs[0]
        ids = tokenizer.encode(f"{rec.render_context()}\n\nQuestion: {rec.question}",
                               add_special_tokens=False)
        row: dict[str, Any] = {"target_tokens": length, "tokens": len(ids)}
        if stop_reason is None and len(ids) > args.baseline_max_tokens:
            stop_reason = f"longer than --baseline-max-tokens ({args.baseline_max_tokens})"
        if stop_reason is None:
            stop_reason = over_time_limit(previous, len(ids), 2, args.case_timeout)
        if stop_reason is not None:
            row["status"] = f"skipped: {stop_reason}"
            rows.append(row)
            continue
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            with time_limit(args.case_timeout), torch.no_grad():
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(input_ids=torch.tensor([ids], device=device), use_cache=False,
                      logits_to_keep=1)
                if cuda:
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - t0
        except (torch.OutOfMemoryError, CaseTimeout) as exc:
            stop_reason = "out of memory" if isinstance(exc, torch.OutOfMemoryError) else str(exc)
            row["status"] = stop_reason
            rows.append(row)
            continue
        row.update(status="ok", seconds=seconds)
        if cuda:
            row["peak_mem_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rows.append(row)
        previous = (len(ids), seconds)
        print(f"baseline {len(ids):,} tokens: forward {seconds:.2f} s"
              + (f", peak {row['peak_mem_allocated_gib']:.1f} GiB" if cuda else ""), flush=True)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return rows


def over_time_limit(previous: tuple[int, float] | None, size: int, power: int,
                    limit: float | None) -> str | None:
    """Why to skip a case of `size`: the last case's (size, seconds) scaled by
    (size / its size) ** power (1: MemAgent, linear; 2: a full-context forward, quadratic)
    predicts more than `limit` seconds. None: run it."""
    if not previous or not limit:
        return None
    predicted = previous[1] * (size / previous[0]) ** power
    if predicted <= limit:
        return None
    return (f"predicted {predicted:.0f} s ({('linear', 'quadratic')[power - 1]}) > "
            f"--case-timeout {limit:g}")


# ---------------------------------------------------------------------------------- MemAgent
def run_length(agent: Any, records: list[Any], timeout: float) -> dict[str, Any]:
    """One MemAgent evaluation over `records`: per-step times from its progress events.

    Lockstep (an engine without continuous batching) reports one "chunks" event per chunk
    step of all episodes; async episodes (vLLM, as `memrl eval` runs them) one per memory
    update of any episode, so `chunk_step_s` is then the interval between consecutive
    memory-update completions, all episodes running concurrently."""
    import torch

    stamps: list[tuple[str, float]] = []

    def on_event(event: Any) -> None:
        stamps.append((event.kind, time.perf_counter()))

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        with time_limit(timeout):
            trajs = agent.run(records, num_samples=1, progress=on_event, keep_token_ids=False)
    except CaseTimeout as exc:
        return {"status": "timeout", "error": str(exc), "chunk_steps_done": len(stamps) - 1}
    total = time.perf_counter() - t0
    times = [b - a for (_, a), (_, b) in zip(stamps, stamps[1:], strict=False)]
    kinds = [k for k, _ in stamps[1:]]
    chunk_times = [t for t, k in zip(times, kinds, strict=True) if k == "chunks"]
    final_times = [t for t, k in zip(times, kinds, strict=True) if k == "final"]
    turns = [t for traj in trajs for t in traj.turns]
    updates = [t for t in turns if t.kind == "memory_update"]
    row: dict[str, Any] = {
        "status": "ok", "total_s": total,
        "context_tokens": [traj.details.context_tokens for traj in trajs],
        "chunks": [traj.details.num_chunks for traj in trajs],
        "chunk_step_s": spread(chunk_times),
        "chunk_step_s_after_first": spread(chunk_times[1:]) if len(chunk_times) > 1 else None,
        "final_step_s": final_times[0] if final_times else None,
        "update_prompt_tokens_max": max(t.prompt_tokens for t in updates),
        "update_prompt_tokens_mean": statistics.fmean(t.prompt_tokens for t in updates),
        "update_response_tokens": sorted({t.response_tokens for t in updates}),
        "max_sequence_tokens": max(t.prompt_tokens + t.response_tokens
                                   for t in turns),
        "gpu_used_gib": gpu_memory_used_gib(),
    }
    if cuda:
        row["torch_peak_mem_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def memagent_lengths(model_dir: Path, records: dict[int, list[Any]], args: argparse.Namespace,
                     device: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    from memrl.agents.memagent import MemAgent, MemAgentConfig
    from memrl.inference import VLLMConfig, VLLMEngine, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    t0 = time.perf_counter()
    # Longest sequence: chunk + memory (re-encoded: may be a little longer than written) +
    # template and question (a few hundred tokens) + the reply.
    longest = args.chunk_size + 2 * args.memory_tokens + args.final_tokens + 1024
    engine = VLLMEngine(model_dir, tokenizer, VLLMConfig(
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=longest,
        max_num_seqs=max(args.questions, 1), enforce_eager=args.enforce_eager, seed=args.seed,
        kv_cache_memory_bytes=None if device == "cuda" else 1 << 28))
    timing = {"vllm_startup_s": time.perf_counter() - t0}
    print(f"vLLM engine up in {timing['vllm_startup_s']:.1f} s", flush=True)
    agent = MemAgent(FixedLengthReplies(engine), MemAgentConfig(
        chunk_size=args.chunk_size, max_memory_tokens=args.memory_tokens,
        max_final_tokens=args.final_tokens, temperature=1.0, top_p=1.0, seed=args.seed))
    first = next(iter(records.values()))
    t0 = time.perf_counter()
    agent.run(first[:1], num_samples=1, keep_token_ids=False)  # warm-up (not recorded)
    timing["warmup_s"] = time.perf_counter() - t0
    rows = []
    previous: tuple[int, float] | None = None
    stop_reason = None
    for length, recs in records.items():
        row: dict[str, Any] = {"target_tokens": length, "questions": len(recs)}
        if stop_reason is None:
            stop_reason = over_time_limit(previous, length, 1, args.case_timeout)
        if stop_reason is not None:
            row["status"] = f"skipped: {stop_reason}"
            rows.append(row)
            continue
        row.update(run_length(agent, recs, args.case_timeout))
        rows.append(row)
        if row["status"] != "ok":
            stop_reason = f"an earlier length ended with {row['status']}"  # engine state unknown
            continue
        previous = (length, row["total_s"])
        c = row["chunk_step_s"]
        print(f"MemAgent {length:,} tokens ({max(row['chunks'])} chunks): total "
              f"{row['total_s']:.1f} s, chunk step {c['mean']:.2f} ± {c['std']:.2f} s, "
              f"longest sequence {row['max_sequence_tokens']:,} tokens", flush=True)
    return rows, timing


# ---------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    with run_record(args.out, "linear_cost_gpu", args, engine="vllm"):
        return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from memrl.eval.report import plot_scores
    from memrl.inference import load_tokenizer

    env = environment()
    print_environment(env)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = dict(TINY if args.tiny else QWEN25_05B)
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="memrl_linear_")
    work = Path(args.work_dir or tmp.name)
    t0 = time.perf_counter()
    model_info = random_model_dir(work / "model", shape, tiny=args.tiny, seed=args.seed,
                                  device=device)
    records = documents(args.lengths, args.questions, load_tokenizer(work / "model"), args.seed)
    timing = {"build_model_and_data_s": time.perf_counter() - t0}

    base = [] if args.no_baseline else baseline(work / "model", records, args, device)
    rows, engine_timing = memagent_lengths(work / "model", records, args, device)
    timing.update(engine_timing)

    ok = [r for r in rows if r["status"] == "ok"]
    analysis: dict[str, Any] = {}
    if len(ok) >= 2:
        per_chunk = [r["chunk_step_s"]["mean"] for r in ok]
        tokens = [statistics.fmean(r["context_tokens"]) for r in ok]
        analysis = {
            "total_time_vs_tokens": linear_fit(tokens, [r["total_s"] for r in ok]),
            "chunk_step_mean_max_relative_deviation": max_relative_deviation(per_chunk),
            "max_sequence_tokens": sorted({r["max_sequence_tokens"] for r in ok}),
        }
        used = [r["gpu_used_gib"] for r in ok if r.get("gpu_used_gib") is not None]
        if used:
            analysis["gpu_used_gib_range"] = [min(used), max(used)]
    plot = Path(args.plot) if args.plot else (
        Path(args.out).with_name("linear_cost.png") if args.out else Path("linear_cost.png"))
    by_len = {r["target_tokens"]: r for r in rows}
    base_by_len = {r["target_tokens"]: r for r in base}
    nan = float("nan")
    series = {"MemAgent, vLLM engine (total s)": [
        by_len[n]["total_s"] if by_len[n]["status"] == "ok" else nan for n in args.lengths]}
    if base:
        series["full-context HF forward, prefill only (s)"] = [
            base_by_len[n]["seconds"] if base_by_len[n]["status"] == "ok" else nan
            for n in args.lengths]
    plot_scores(plot, args.lengths, series, xlabel="document length (tokens)",
                ylabel="seconds", title="Cost against document length", ylim=None)

    summary = {
        "benchmark": "memrl linear cost: MemAgent (vLLM) vs full-context forward",
        "environment": env,
        "model": model_info,
        "settings": {"lengths": args.lengths, "questions": args.questions,
                     "chunk_size": args.chunk_size, "memory_tokens": args.memory_tokens,
                     "final_tokens": args.final_tokens, "ignore_eos": True,
                     "temperature": 1.0, "top_p": 1.0,
                     "gpu_memory_utilization": args.gpu_memory_utilization,
                     "enforce_eager": args.enforce_eager, "case_timeout_s": args.case_timeout,
                     "baseline_max_tokens": None if args.no_baseline else
                     args.baseline_max_tokens},
        "timing_s": timing,
        "memagent": rows,
        "baseline": base,
        "analysis": analysis,
        "plot": str(plot),
    }
    print_table(summary)
    write_summary(summary, args.out)
    if tmp is not None:
        tmp.cleanup()
    return summary


def print_table(summary: dict[str, Any]) -> None:
    base = {r["target_tokens"]: r for r in summary["baseline"]}
    print("\nlength | chunks | MemAgent total s | chunk step s (mean ± std) | GPU used GiB | "
          "full-context forward s | its peak GiB")
    for r in summary["memagent"]:
        b = base.get(r["target_tokens"], {})
        if r["status"] == "ok":
            c = r["chunk_step_s"]
            cells = [f"{max(r['chunks'])}", f"{r['total_s']:.1f}",
                     f"{c['mean']:.2f} ± {c['std']:.2f}",
                     "-" if r["gpu_used_gib"] is None else f"{r['gpu_used_gib']:.1f}"]
        else:
            cells = ["-", r["status"], "-", "-"]
        bcell = f"{b['seconds']:.2f}" if b.get("status") == "ok" else b.get("status", "-")
        peak = b.get("peak_mem_allocated_gib")
        print(" | ".join([f"{r['target_tokens']:,}", *cells, bcell,
                          "-" if peak is None else f"{peak:.1f}"]))
    a = summary["analysis"]
    if a:
        fit = a["total_time_vs_tokens"]
        print(f"total time ≈ {fit['slope'] * 1000:.4f} s per 1K tokens + "
              f"{fit['intercept']:.1f} s (R² {fit['r2']:.4f}); chunk-step means within "
              f"±{a['chunk_step_mean_max_relative_deviation']:.1%} of their mean; plot "
              f"{summary['plot']}", flush=True)


if __name__ == "__main__":  # the guard vLLM's engine processes need
    main()

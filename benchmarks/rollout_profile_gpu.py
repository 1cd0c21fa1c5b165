"""Where the vLLM rollout's time goes: memrl's engine against vLLM called directly.

One workload (a Qwen2.5-0.5B-shaped model with random weights, BATCH prompts of PROMPT
random tokens, NEW new tokens each, `ignore_eos`), one vLLM engine, timed these ways, each
REPEATS times in turn (the table reports the median):

    vllm_direct                      `vllm.LLM.generate`: no log-probs, no seeds (vLLM's speed)
    vllm_direct_logprobs             + a log-prob per token, a dict of objects per token
    vllm_direct_flat_logprobs        + a log-prob per token, in flat lists
    vllm_direct_seeded               + a seed per request, no log-probs
    vllm_direct_flat_logprobs_seeded flat log-probs and seeds (what memrl asks vLLM for)
    vllm_driver_cumulative           memrl's async driver before 93a36ab: memrl's requests
                                     with vLLM's default output kind (an output of every
                                     running request at every engine.step()) and dict
                                     log-probs

(The direct calls do not detokenize, as memrl's requests without stop strings do not. The
results of 2026-11-27 in docs/lab/benchmarks.md came from the script of 93a36ab, whose direct
calls and cumulative driver detokenized every token.)
    memrl_vllm_generator             memrl's `VLLMEngine.generate` (lockstep rollouts)
    memrl_vllm_agenerate             memrl's `VLLMEngine.agenerate`, every request a coroutine
                                     (async rollouts: the recipe's default)

then a `torch.profiler` trace of `memrl_vllm_agenerate`, summarised as the top operators by
CPU and by CUDA time. The gap between vllm_direct and memrl's rows is memrl's and the
options' share; the gap between vllm_direct and the decode bound of
`benchmarks/rollout_gpu.py` is vLLM's own.

    python benchmarks/rollout_profile_gpu.py --out prof.json              # GPU, ~4 minutes
    python benchmarks/rollout_profile_gpu.py --tiny --out /tmp/prof.json  # CPU check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (  # noqa: E402
    QWEN25_05B,
    TINY,
    environment,
    print_environment,
    profile_call,
    random_model_dir,
    run_record,
)
from rollout_gpu import random_prompts  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--prompt", type=int, default=None)
    p.add_argument("--new", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each variant")
    args = p.parse_args(argv)
    with run_record(args.out, "rollout_profile_gpu", args, engine="vllm"):
        return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from memrl.inference import SamplingParams, VLLMConfig, VLLMEngine, load_tokenizer

    env = environment()
    print_environment(env)
    cuda = torch.cuda.is_available()
    shape = dict(TINY if args.tiny else QWEN25_05B)
    batch = args.batch or (8 if args.tiny else 256)
    prompt_len = args.prompt or (32 if args.tiny else 1024)
    new = args.new or (8 if args.tiny else 256)
    work = Path(tempfile.mkdtemp(prefix="memrl_prof_"))
    info = random_model_dir(work / "model", shape, tiny=args.tiny, seed=args.seed,
                            device="cuda" if cuda else "cpu")
    tokenizer = load_tokenizer(work / "model")
    engine = VLLMEngine(work / "model", tokenizer, VLLMConfig(
        gpu_memory_utilization=0.6, max_model_len=prompt_len + new, max_num_seqs=batch,
        seed=args.seed, kv_cache_memory_bytes=None if cuda else 1 << 28))
    low, high = info["tokenizer_bpe_tokens"], info["tokenizer_tokens"]
    if high - low < 2:
        low = 0
    prompts = random_prompts(batch, prompt_len, low, high, args.seed)

    params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=args.seed,
                            ignore_eos=True)

    variants = timed_variants(engine, prompts, params, batch=batch, new=new)
    for fn in variants.values():  # warm-up (CUDA graphs, each sampling path compiled)
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):  # in turn, so a slow spell of the host hits every row
        for name, fn in variants.items():
            times[name].append(fn())
    runs = {k: statistics.median(v) for k, v in times.items()}
    tokens = batch * new
    rates = {k: tokens / v for k, v in runs.items()}
    profiled = profile_call(variants["memrl_vllm_agenerate"], cuda=cuda)
    table_cpu, table_cuda = profiled["top_self_cpu"], profiled.get("top_self_cuda", "")
    out = {"benchmark": "memrl rollout profile: VLLMEngine vs vllm.LLM.generate",
           "environment": env, "batch": batch, "prompt_tokens": prompt_len, "new_tokens": new,
           "repeats": args.repeats, "seconds": runs, "seconds_each": times,
           "new_tokens_per_s": rates,
           "profile_top_self_cpu": table_cpu, "profile_top_self_cuda": table_cuda}
    print(table_cpu)
    print(table_cuda)
    for k, v in rates.items():
        print(f"{k}: {v:,.0f} new tok/s ({runs[k]:.2f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return out


def timed_variants(engine: Any, prompts: list[list[int]], params: Any, *, batch: int,
                   new: int) -> dict[str, Callable[[], float]]:
    """The ways of generating `new` tokens for each of `prompts`, each a function timing one
    run in seconds: vLLM's `LLM.generate` directly (with and without log-probs and seeds),
    memrl's old async driver (cumulative outputs), and memrl's VLLMEngine (`generate`,
    `agenerate`)."""
    from vllm import SamplingParams as VSP
    from vllm.sampling_params import RequestOutputKind

    from memrl.inference.base import checked_requests
    from vllm.inputs import TokensPrompt

    raw = [TokensPrompt(prompt_token_ids=list(x)) for x in prompts]

    def direct(**kw: Any) -> float:
        t0 = time.perf_counter()
        outs = engine.llm.generate(raw, vllm_params(**kw), use_tqdm=False)
        dt = time.perf_counter() - t0
        assert sum(len(o.outputs[0].token_ids) for o in outs) == batch * new
        return dt

    def vllm_params(**kw: Any) -> list[Any]:
        # detokenize=False, as memrl asks whenever a request has no stop string
        return [VSP(max_tokens=new, min_tokens=new, ignore_eos=True, temperature=1.0,
                    seed=(kw["seed"] + i) if kw.get("seed") is not None else None,
                    logprobs=kw.get("logprobs"), flat_logprobs=kw.get("flat", False),
                    detokenize=False)
                for i in range(batch)]

    def driver_cumulative() -> float:
        """memrl's async driver before 93a36ab: its requests (memrl's SamplingParams, with
        vLLM's default output kind, which `add_request` keeps, and dict log-probs) through
        engine.step() until every request ends."""
        core, tokens = engine.llm.llm_engine, {}
        old = [engine.sampling_params(p) for p in checked_requests(prompts, params)]
        for sp in old:
            sp.output_kind, sp.flat_logprobs = RequestOutputKind.CUMULATIVE, False
        t0 = time.perf_counter()
        for i, (prompt, sp) in enumerate(zip(raw, old, strict=True)):
            core.add_request(f"cumulative-{i}", prompt, sp)
        while len(tokens) < batch:
            tokens.update((o.request_id, len(o.outputs[0].token_ids))
                          for o in core.step() if o.finished)
        dt = time.perf_counter() - t0
        assert sum(tokens.values()) == batch * new
        return dt

    def memrl_generate() -> float:
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        dt = time.perf_counter() - t0
        assert sum(len(g.token_ids) for g in gens) == batch * new
        return dt

    def memrl_agenerate() -> float:
        async def rollout() -> list[Any]:
            return await asyncio.gather(*(engine.agenerate(x, params) for x in prompts))

        t0 = time.perf_counter()
        gens = asyncio.run(rollout())
        dt = time.perf_counter() - t0
        assert sum(len(g.token_ids) for g in gens) == batch * new
        return dt

    variants = {
        "vllm_direct": direct,
        "vllm_direct_logprobs": lambda: direct(logprobs=0),
        "vllm_direct_flat_logprobs": lambda: direct(logprobs=0, flat=True),
        "vllm_direct_seeded": lambda: direct(seed=1),
        "vllm_direct_flat_logprobs_seeded": lambda: direct(logprobs=0, flat=True, seed=1),
        "vllm_driver_cumulative": driver_cumulative,
        "memrl_vllm_generator": memrl_generate,
        "memrl_vllm_agenerate": memrl_agenerate,
    }
    return variants


if __name__ == "__main__":
    main()

"""Where the vLLM rollout's time goes: memrl's engine against vLLM called directly.

One workload (a Qwen2.5-0.5B-shaped model with random weights, BATCH prompts of PROMPT
random tokens, NEW new tokens each, `ignore_eos`), one vLLM engine, timed four ways:

1. `vllm.LLM.generate` directly, no log-probs, no seeds  (vLLM's own speed)
2. the same with a log-prob for every token              (what log-probs cost)
3. the same with a seed for every request                (what per-request seeds cost)
4. memrl's `VLLMEngine.generate` (log-probs + seeds)  (what memrl adds on top)

then a `torch.profiler` trace of run 4, summarised as the top operators by CPU and by CUDA
time. The gap between runs 1 and 4 is memrl's and the options' share; the gap between run 1
and the decode bound of `benchmarks/rollout_gpu.py` is vLLM's own.

    python benchmarks/rollout_profile_gpu.py --out prof.json              # GPU, ~3 minutes
    python benchmarks/rollout_profile_gpu.py --tiny --out /tmp/prof.json  # CPU check
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
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
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    low, high = info["tokenizer_bpe_tokens"], info["tokenizer_tokens"]
    if high - low < 2:
        low = 0
    prompts = random_prompts(batch, prompt_len, low, high, args.seed)
    raw = [TokensPrompt(prompt_token_ids=list(x)) for x in prompts]

    def direct(**kw: Any) -> float:
        params = [VSP(max_tokens=new, min_tokens=new, ignore_eos=True, temperature=1.0,
                      seed=(kw["seed"] + i) if kw.get("seed") is not None else None,
                      logprobs=kw.get("logprobs")) for i in range(batch)]
        t0 = time.perf_counter()
        outs = engine.llm.generate(raw, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        assert sum(len(o.outputs[0].token_ids) for o in outs) == batch * new
        return dt

    def memrl_generate() -> float:
        t0 = time.perf_counter()
        gens = engine.generate(prompts, SamplingParams(max_new_tokens=new, temperature=1.0,
                                                       seed=args.seed, ignore_eos=True))
        dt = time.perf_counter() - t0
        assert sum(len(g.token_ids) for g in gens) == batch * new
        return dt

    direct()  # warm-up (CUDA graphs, compilation of sampling paths)
    memrl_generate()
    runs = {
        "vllm_direct": direct(),
        "vllm_direct_logprobs": direct(logprobs=0),
        "vllm_direct_logprobs_seeded": direct(logprobs=0, seed=1),
        "memrl_vllm_generator": memrl_generate(),
    }
    tokens = batch * new
    rates = {k: tokens / v for k, v in runs.items()}
    profiled = profile_call(memrl_generate, cuda=cuda)
    table_cpu, table_cuda = profiled["top_self_cpu"], profiled.get("top_self_cuda", "")
    out = {"benchmark": "memrl rollout profile: VLLMEngine vs vllm.LLM.generate",
           "environment": env, "batch": batch, "prompt_tokens": prompt_len, "new_tokens": new,
           "seconds": runs, "new_tokens_per_s": rates,
           "profile_top_self_cpu": table_cpu, "profile_top_self_cuda": table_cuda}
    print(table_cpu)
    print(table_cuda)
    for k, v in rates.items():
        print(f"{k}: {v:,.0f} new tok/s ({runs[k]:.2f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

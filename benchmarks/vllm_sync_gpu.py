"""Does `VLLMEngine.sync_weights` reach the engine's weights, under each vLLM model runner?

A Qwen2.5-0.5B-shaped model with random weights (`--tiny`: the tiny shape, on the CPU):
the engine samples answers, the policy takes one AdamW step (lr 1e-2) on its own prompts,
and the engine's log-probs of fresh samples are compared with the policy's (a bfloat16
engine against a float32 policy on a GPU) before and after `sync_weights`: stale weights
leave a large gap, synced ones the engine's numerical one. Per runner (`--runners`), one
engine each, in a process of its own (vLLM reads VLLM_USE_V2_MODEL_RUNNER once).

    python benchmarks/vllm_sync_gpu.py --out $OUT/sync.json        # GPU: v1 and v2, ~3 min
    python benchmarks/vllm_sync_gpu.py --tiny --out /tmp/sync.json  # CPU check (v1)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (  # noqa: E402
    QWEN25_05B,
    TINY,
    environment,
    print_environment,
    random_model_dir,
    run_record,
    write_summary,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--runners", default=None, help="comma-separated of v1,v2 (default: "
                   "both on a GPU, v1 on a CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.runners is not None:
        names = args.runners.split(",")
        if not names or any(n not in ("v1", "v2") for n in names):
            p.error(f"--runners: comma-separated of v1, v2; got {args.runners!r}")
    return args


def gap(policy: Any, prompts: list[list[int]], generations: Any) -> float:
    """Largest |engine − policy| log-prob over every sampled token."""
    import torch

    worst = 0.0
    device = next(policy.parameters()).device
    for prompt, g in zip(prompts, generations, strict=True):
        if not g.token_ids:
            continue
        ids = torch.tensor([prompt + list(g.token_ids)], device=device)
        with torch.no_grad():
            logits = policy(ids).logits[0, len(prompt) - 1 : -1].float()
        mine = logits.log_softmax(-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
        worst = max(worst, float((torch.tensor(g.logprobs, device=device) - mine).abs().max()))
    return worst


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One runner: gaps before and after the sync."""
    import torch

    from memrl.inference import SamplingParams, VLLMConfig, VLLMEngine, load_model, load_tokenizer

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    tokenizer = load_tokenizer(args.model_dir)
    policy = load_model(args.model_dir, device=device, dtype="float32")
    engine = VLLMEngine(args.model_dir, tokenizer, VLLMConfig(
        model_runner=args.child, max_model_len=512, seed=args.seed,
        gpu_memory_utilization=0.3, kv_cache_memory_bytes=None if cuda else 1 << 28))
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(10, 200, (24,), generator=g).tolist() for _ in range(4)]
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=args.seed)
    before = gap(policy, prompts, engine.generate(prompts, params))
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy.train()
    loss = sum(policy(torch.tensor([p], device=device), labels=torch.tensor([p], device=device)
                      ).loss for p in prompts)
    loss.backward()
    opt.step()
    policy.eval()
    stale = gap(policy, prompts, engine.generate(prompts, params))
    engine.sync_weights(policy, 1)
    synced = gap(policy, prompts, engine.generate(prompts, params))
    engine.close()
    return {"runner": args.child, "resolved": engine.model_runner, "gap_before_step": before,
            "gap_stale": stale, "gap_synced": synced,
            "reaches_engine": synced < stale / 10}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return {}
    with run_record(args.out, "vllm_sync_gpu", args, engine="vllm"):
        return run(args)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    env = environment()
    print_environment(env)
    cuda = torch.cuda.is_available()
    runners = (args.runners.split(",") if args.runners else (["v1", "v2"] if cuda else ["v1"]))
    work = Path(tempfile.mkdtemp(prefix="memrl_sync_"))
    random_model_dir(work / "model", dict(TINY if args.tiny else QWEN25_05B), tiny=args.tiny,
                     seed=args.seed, device="cuda" if cuda else "cpu")
    rows = []
    for runner in runners:
        cmd = [sys.executable, __file__, "--child", runner, "--model-dir", str(work / "model"),
               "--seed", str(args.seed)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        row = (json.loads(lines[-1][7:]) if lines else
               {"runner": runner, "error": (done.stderr.strip().splitlines() or ["?"])[-1]})
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {"benchmark": "vllm_sync_gpu", "environment": env, "runs": rows}
    write_summary(summary, args.out)
    return summary


if __name__ == "__main__":
    main()

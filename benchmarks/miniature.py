"""MemAgent's length-extrapolation claim, in miniature, on one GPU.

A model of tens of millions of parameters is built and trained from scratch by memrl, with
the quickstart's pipeline at GPU size (`memrl.apps.quickstart.run_quickstart` with a larger
`QuickstartPlan`): one-fact synthetic questions whose training documents fit in at most 4
chunks, a warm start on the oracle's trajectories (`memrl sft`), GRPO on the real answer
reward (sub-EM), and greedy MemAgent evaluations at 1x, 4x, 16x, 64x and 256x the training
document count, on people never seen in training. The claim to check: accuracy stays nearly
flat as the document grows (the memory has a fixed size), and RL improves on the warm start.

    python benchmarks/miniature.py --out runs/miniature                 # GPU, ~5-8 minutes
    python benchmarks/miniature.py --out /tmp/mini --tiny               # CPU smoke check

Writes OUT/summary.json (the accuracy table), OUT/accuracy.png and every evaluation's
results.json / trajectories (browse them with `memrl view OUT/eval_rl`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

GPU_SHAPE = {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4,
             "intermediate_size": 1536, "vocab_size": 2048, "initializer_range": 0.02}
"""About 27M parameters (with the 2,048-word tokenizer memrl trains on the task's text)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run directory (replaced)")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke check: tiny sizes")
    ap.add_argument("--sft-steps", type=int, default=None)
    ap.add_argument("--rl-steps", type=int, default=None)
    ap.add_argument("--eval-questions", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-docs", default=None,
                    help="comma-separated document counts (default 4,16,64,256,1024: 1x-256x)")
    ap.add_argument("--skip-before", action="store_true",
                    help="do not evaluate the untrained model (it scores 0 and is the slowest)")
    args = ap.parse_args()

    import torch

    from memrl.apps.quickstart import MODEL_SHAPE, QuickstartPlan, run_quickstart

    tiny = args.tiny or not torch.cuda.is_available()
    train_docs = 4
    plan = QuickstartPlan(
        train_docs=train_docs,
        eval_docs=tuple(int(n) for n in args.eval_docs.split(",")) if args.eval_docs else
        tuple(train_docs * k for k in ((1, 4) if tiny else (1, 4, 16, 64, 256))),
        eval_questions=args.eval_questions or (8 if tiny else 48),
        train_questions=200 if tiny else 20000,
        model_shape=dict(MODEL_SHAPE if tiny else GPU_SHAPE),
        device="cpu" if tiny else "cuda",
        eval_batch_size=64,
        evaluate_before=not args.skip_before,
    )
    sft_steps = args.sft_steps or (5 if tiny else 3000)
    rl_steps = args.rl_steps or (1 if tiny else 40)
    out = Path(args.out)
    overrides = [
        f"seed={args.seed}", f"model.path={out}/model", f"model.device={plan.device}",
        f"data.train_file={out}/data/train.jsonl", f"data.val_file={out}/data/val.jsonl",
        f"trainer.out_dir={out}/rl", f"trainer.total_steps={rl_steps}",
        f"trainer.save_freq={rl_steps}", f"trainer.test_freq={max(rl_steps // 4, 1)}",
        "data.train_batch_size=32" if not tiny else "data.train_batch_size=2",
        "rl.ppo_mini_batch_size=32" if not tiny else "rl.ppo_mini_batch_size=2",
        "optim.lr=0.0003",
    ]
    sft_overrides = [
        f"model.device={plan.device}", f"trainer.total_steps={sft_steps}",
        f"trainer.save_freq={sft_steps}", "sft.batch_size=32" if not tiny else "sft.batch_size=4",
        "sft.micro_batch_size=128", "optim.lr=0.001", "optim.warmup_steps=100",
    ]
    command = "python benchmarks/miniature.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else f"--{k}"
        for k, v in vars(args).items() if v not in (None, False))
    t0 = time.time()
    summary = run_quickstart("configs/quickstart.yaml", overrides, sft_overrides=sft_overrides,
                             fresh=True, plan=plan)
    summary.update({
        "command": command, "wall_s": round(time.time() - t0, 1),
        "plan": {**plan.__dict__, "eval_docs": list(plan.eval_docs)},
        "sft_steps": sft_steps, "rl_steps": rl_steps,
        "torch": torch.__version__, "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if plan.device == "cuda" else "cpu",
        "parameters": _parameters(out / "model"),
    })
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))


def _parameters(model_dir: Path) -> int:
    from memrl.inference.loader import load_pretrained

    model, _ = load_pretrained(model_dir, device="cpu")
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    main()

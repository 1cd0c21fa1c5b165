"""Benchmark of one MemAgent RL training step (rollout → old/ref log-probs → PPO update).

Two modes. By default, the whole recipe step (below). With --update-only, the training side
alone on MemAgent-shaped batches (`run_update_only`): very uneven conversations (prompts of
1K–6K tokens, responses of 64–1K by default), timed per micro-batch token budget, padded or
packed (--remove-padding), with tokens/s, MFU, padding waste and peak memory per budget:

    python benchmarks/train_step_gpu.py --update-only       # GPU: packed, varlen attention
    python benchmarks/train_step_gpu.py --update-only --padded --attn sdpa  # the padded path
    python benchmarks/train_step_gpu.py --update-only --tiny              # CPU check, seconds

The recipe mode builds a causal LM with the shape of Qwen2.5-0.5B and random weights (nothing
is downloaded), writes synthetic long-context questions, and runs the GRPO recipe
(`memrl.recipes.grpo.setup` + `train_step`) for a few steps. The first `--warmup` steps are
excluded from the means (CUDA context, kernel selection, allocator growth). The summary (JSON,
also printed) gives per-step and mean numbers: rollout and training throughput, step time,
peak GPU memory.

    python benchmarks/train_step_gpu.py --json-out bench.json            # Qwen2.5-0.5B shape
    python benchmarks/train_step_gpu.py --engine vllm --json-out v.json  # colocated vLLM
    python benchmarks/train_step_gpu.py --engine vllm --recipe-shapes    # published shapes
    python benchmarks/train_step_gpu.py --tiny [--engine vllm]           # CPU smoke check
    python benchmarks/train_step_gpu.py --remove-padding --attn flex_attention  # other kernels

`--engine vllm` rolls out on the colocated vLLM engine (`rollout.engine: vllm`: weights
synced from the policy every step, sleep during the update, wake before the next rollout).
The step is then broken down as rollout / weight sync / old+ref log-probs / update from the
recipe's `perf/*_s` metrics, with the engine's public `wake`, `sync_weights` and `sleep`
wrapped to time them apart (`perf/sync_s` holds wake + sync, `perf/rollout_s` the sleep).
`--recipe-shapes` takes the published MemAgent recipe's per-conversation shapes
(configs/memagent_qwen2.5-7b_hotpotqa.yaml: 5000-token chunks, 1024-token memories and
answers, 16 samples per question, temperature 1, 16384 tokens per micro-batch, gradient
checkpointing) scaled to one GPU: 2 questions per step (32 trajectories) of about two
chunks each, one question per mini-batch.

Choices that make a random-weight run measure what a real run would:
- The tokenizer is a small BPE trained here, padded with placeholder tokens (`<|r123|>`) up
  to the model's vocabulary. A random model samples ids uniformly over 151,936 tokens; without
  the padding almost none would decode to text, so each memory would re-encode to a handful
  of tokens and every later prompt would be ~256 tokens shorter than in a real run. With it,
  a 256-token memory re-encodes to about 256 tokens, as with Qwen's own tokenizer.
- Rewards are random 0/1 (seeded), dynamic sampling is off and overlong responses are kept
  (`rl.overlong=keep`): a random model never answers, never stops (EOS has probability
  ~1/151,936 per token) and always hits max tokens, so with the defaults every group would be
  dropped and refilled (three times the rollouts) and every token masked out of the loss.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (  # noqa: E402
    SHAPES,
    TINY,
    GCPauses,
    build_model_dir,
    compiled_graphs,
    environment,
    gpu_memory_used_gib,
    print_environment,
    run_record,
    count_host_syncs,
    profile_call,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    add_update_only_arguments(p)
    add_recipe_arguments(p)
    args = p.parse_args(argv)
    apply_presets(args)
    try:
        args.prompt_len = int_range(args.prompt_len)
        args.response_len = int_range(args.response_len)
        args.budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError as exc:
        p.error(str(exc))
    if args.num_questions is None:
        args.num_questions = args.steps * args.train_batch_size
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if not 2 <= args.docs_min <= args.docs_max:
        p.error("need 2 <= --docs-min <= --docs-max")
    if args.checkpoint_every < 1 or (args.checkpoint_every > 1
                                     and not args.gradient_checkpointing):
        p.error("--checkpoint-every N needs N >= 1 and --gradient-checkpointing")
    return args


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The run (output, steps, seed, device) and the model (shape, attention, packing)."""
    from memrl.recipes.config import ModelConfig
    from memrl.rl.config import RLConfig

    p.add_argument("--tiny", action="store_true",
                   help="tiny model and data (CPU smoke check); other flags still apply")
    p.add_argument("--out-dir", default="runs/bench_train_step",
                   help="work directory (model, data, trainer output); emptied first")
    p.add_argument("--json-out", default=None, help="also write the summary JSON here")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 3; tiny 2)")
    p.add_argument("--warmup", type=int, default=1, help="leading steps left out of the means")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available)")
    # model
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b",
                   help="Qwen2.5 architecture of the random-weight model (default 0.5b)")
    p.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    p.add_argument("--tokenizer-vocab", type=int, default=None,
                   help="BPE merges target of the trained tokenizer (default 8192; tiny 512)")
    p.add_argument("--no-pad-tokenizer", action="store_true",
                   help="do not pad the tokenizer with placeholder tokens to the model vocab")
    p.add_argument("--gradient-checkpointing", action="store_true", default=None,
                   help="recompute activations in the backward (on with --recipe-shapes)")
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing",
                   action="store_false", help="off, also with --recipe-shapes")
    p.add_argument("--checkpoint-every", type=int,
                   default=ModelConfig.model_fields["gradient_checkpointing_every_n_layers"].default,
                   help="with --gradient-checkpointing: only every n-th decoder layer "
                        "(model.gradient_checkpointing_every_n_layers)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile every decoder layer (model.compile)")
    p.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                   help="trainer.gc_freeze=false: the heap is not frozen after the first step "
                        "(the recipe's loop freezes it by default; this script runs the steps "
                        "itself and does the same)")
    p.add_argument("--old-logprobs", choices=["auto", "recompute"],
                   default=RLConfig.model_fields["old_logprobs"].default,
                   help="rl.old_logprobs (recipe mode; auto: from the update's own forward "
                        "on-policy, recompute: the separate pass measured before it existed)")
    p.add_argument("--attn", default="auto",
                   choices=["auto", "sdpa", "flex_attention", "eager", "varlen"],
                   help="attention kernel (model.attn_implementation; auto, its default: "
                        "varlen on a GPU, sdpa on a CPU)")
    p.add_argument("--remove-padding", action="store_const", const=True, default="auto",
                   help="packed micro-batches without padding (rl.remove_padding true; "
                        "default auto: packed with varlen attention)")
    p.add_argument("--padded", dest="remove_padding", action="store_const", const=False,
                   help="right-padded micro-batches (rl.remove_padding false)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="peak TFLOP/s for MFU (default: memrl.rl.maths.flops table, bf16 dense)")


def add_update_only_arguments(p: argparse.ArgumentParser) -> None:
    """`--update-only`: old log-probs + PPO updates on synthetic batches, per token budget."""
    p.add_argument("--update-only", action="store_true",
                   help="time old log-probs + PPO update on synthetic MemAgent-shaped batches")
    p.add_argument("--samples", type=int, default=None,
                   help="update-only: conversations per batch (default 48; tiny 12)")
    p.add_argument("--prompt-len", default=None,
                   help="update-only: MIN,MAX prompt tokens (default 1024,6144; tiny 16,160)")
    p.add_argument("--response-len", default=None,
                   help="update-only: MIN,MAX response tokens (default 64,1024; tiny 4,40)")
    p.add_argument("--profile", action="store_true",
                   help="update-only: one more update per budget under torch.profiler (top "
                        "operators and GPU busy time in the JSON)")
    p.add_argument("--sync-debug", action="store_true",
                   help="update-only, CUDA: one more update under torch.cuda.set_sync_debug_mode"
                        "('warn'): how many operations waited for the GPU, and where")
    p.add_argument("--budgets", default=None,
                   help="update-only: micro-batch token budgets, comma-separated "
                        "(default 8192,16384,32768; tiny 256,512)")


def add_recipe_arguments(p: argparse.ArgumentParser) -> None:
    """Recipe mode: the data, MemAgent and RL settings, and the rollout engine."""
    # data
    p.add_argument("--num-questions", type=int, default=None,
                   help="training questions written (default steps x train-batch-size)")
    p.add_argument("--docs-min", type=int, default=None, help="documents per question (min)")
    p.add_argument("--docs-max", type=int, default=None, help="documents per question (max)")
    # MemAgent / RL
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--max-memory-tokens", type=int, default=None)
    p.add_argument("--max-final-tokens", type=int, default=None)
    p.add_argument("--rollout-n", type=int, default=None)
    p.add_argument("--train-batch-size", type=int, default=None)
    p.add_argument("--ppo-mini-batch-size", type=int, default=None, help="default 2")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=None, help="default 8192")
    p.add_argument("--generation-batch-size", type=int, default=64)
    p.add_argument("--no-kl", action="store_true", help="turn the KL loss (reference model) off")
    p.add_argument("--keep-checkpoint", action="store_true",
                   help="keep the checkpoint the trainer saves after the last step")
    # rollout engine
    p.add_argument("--strategy", choices=["replicate", "fsdp"], default="replicate",
                   help="model.strategy; under torchrun (--nproc-per-node N) each rank holds "
                        "1/N of the questions of a step (FSDP2: and 1/N of the weights)")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                   help="rollout.engine: the in-process HF engine or colocated vLLM")
    p.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3,
                   help="rollout.vllm.gpu_memory_utilization (the policy, reference and "
                        "optimizer share the GPU)")
    p.add_argument("--vllm-enforce-eager", action="store_true",
                   help="rollout.vllm.enforce_eager (no CUDA graphs)")
    p.add_argument("--vllm-model-runner", choices=["auto", "v1", "v2"], default="auto",
                   help="rollout.vllm.model_runner (auto: v2 on a CUDA GPU, v1 elsewhere)")
    p.add_argument("--recipe-shapes", action="store_true",
                   help="the published recipe's shapes scaled to one GPU (see the docstring)")


def apply_presets(args: argparse.Namespace) -> None:
    """Every setting left unset takes its preset's value: `--tiny`, `--recipe-shapes`, or
    the default shapes."""
    big = {"steps": 3, "tokenizer_vocab": 8192, "docs_min": 80, "docs_max": 120,
           "chunk_size": 1024, "max_memory_tokens": 256, "max_final_tokens": 32,
           "rollout_n": 8, "train_batch_size": 4, "ppo_mini_batch_size": 2,
           "max_tokens_per_micro_batch": 8192, "temperature": 0.7, "top_p": 0.95}
    recipe = {**big, "docs_min": 220, "docs_max": 260, "chunk_size": 5000,
              "max_memory_tokens": 1024, "max_final_tokens": 1024, "rollout_n": 16,
              "train_batch_size": 2, "ppo_mini_batch_size": 1,
              "max_tokens_per_micro_batch": 16384, "temperature": 1.0, "top_p": 1.0}
    tiny = {"steps": 2, "tokenizer_vocab": 512, "docs_min": 6, "docs_max": 10,
            "chunk_size": 128, "max_memory_tokens": 16, "max_final_tokens": 8,
            "rollout_n": 2, "train_batch_size": 2, "ppo_mini_batch_size": 2,
            "max_tokens_per_micro_batch": 8192, "temperature": 0.7, "top_p": 0.95}
    big |= {"samples": 48, "prompt_len": "1024,6144", "response_len": "64,1024",
            "budgets": "8192,16384,32768"}
    recipe |= {"samples": 48, "prompt_len": "1024,6144", "response_len": "64,1024",
               "budgets": "8192,16384,32768"}
    tiny |= {"samples": 12, "prompt_len": "16,160", "response_len": "4,40",
             "budgets": "256,512"}
    if args.tiny and args.recipe_shapes:
        tiny = {**tiny, "temperature": 1.0, "top_p": 1.0, "max_tokens_per_micro_batch": 16384}
    if args.gradient_checkpointing is None:
        args.gradient_checkpointing = args.recipe_shapes and not args.tiny
    for key, value in (tiny if args.tiny else recipe if args.recipe_shapes else big).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def int_range(text: str) -> tuple[int, int]:
    """"MIN,MAX" -> (MIN, MAX), 1 <= MIN <= MAX."""
    lo, hi = (int(x) for x in text.split(","))
    if not 1 <= lo <= hi:
        raise ValueError(f"need 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


# ---------------------------------------------------------------------------------- setup
def write_data(path: Path, args: argparse.Namespace) -> None:
    """Questions with between docs-min and docs-max paragraphs each (ids stay unique)."""
    from memrl.data.hotpotqa import save_records_jsonl
    from memrl.data.synthetic import make_synthetic_records

    rng = random.Random(args.seed)
    records = []
    for i in range(args.num_questions):
        n_docs = rng.randint(args.docs_min, args.docs_max)
        # One question per call, each call with its own seed: ids are syn-{seed}-0.
        records += make_synthetic_records(1, num_docs=n_docs, seed=args.seed * 100_003 + i)
    save_records_jsonl(records, path)


def make_config(args: argparse.Namespace, model_dir: Path, train_file: Path, run_dir: Path):
    from memrl.recipes.config import TrainConfig

    return TrainConfig.model_validate({
        "seed": args.seed,
        "model": {"path": str(model_dir), "dtype": "auto", "device": args.device,
                  "strategy": args.strategy,
                  "gradient_checkpointing": args.gradient_checkpointing,
                  "gradient_checkpointing_every_n_layers": args.checkpoint_every,
                  "compile": args.compile, "attn_implementation": args.attn},
        "data": {"train_file": str(train_file), "train_batch_size": args.train_batch_size,
                 "shuffle": False},
        "memagent": {"chunk_size": args.chunk_size,
                     "max_memory_tokens": args.max_memory_tokens,
                     "max_final_tokens": args.max_final_tokens},
        "rollout": {"n": args.rollout_n, "temperature": args.temperature, "top_p": args.top_p,
                    "generation_batch_size": args.generation_batch_size,
                    "engine": args.engine, "vllm": vllm_config(args)},
        "rl": {"dynamic_sampling": False, "overlong": "keep",
               "use_kl_loss": not args.no_kl, "kl_loss_coef": 0.001,
               "kl_loss_type": "low_var_kl",
               "ppo_mini_batch_size": min(args.ppo_mini_batch_size, args.train_batch_size),
               "use_dynamic_bsz": True, "remove_padding": args.remove_padding,
               "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch,
               "old_logprobs": args.old_logprobs},
        "optim": {"lr": 1e-6},
        "trainer": {"out_dir": str(run_dir), "total_steps": args.steps,
                    "peak_tflops": args.peak_tflops, "gc_freeze": args.gc_freeze,
                    "val_before_train": False, "log_sinks": ["jsonl"]},
    })


def vllm_config(args: argparse.Namespace) -> dict[str, Any]:
    """rollout.vllm: the longest prompt (chunk + memory, which may re-encode a little longer,
    + template and question) plus its response fits."""
    longest = args.chunk_size + args.max_memory_tokens + 1024 + max(
        args.max_memory_tokens, args.max_final_tokens)
    cfg: dict[str, Any] = {"gpu_memory_utilization": args.vllm_gpu_memory_utilization,
                           "enforce_eager": args.vllm_enforce_eager,
                           "model_runner": args.vllm_model_runner,
                           "max_model_len": longest, "seed": args.seed}
    if args.device == "cpu":
        cfg["kv_cache_memory_bytes"] = 1 << 28
    return cfg


# ---------------------------------------------------------------------------------- timing
def make_run(config, reward_seed: int):
    """The recipe's run with a random 0/1 reward; the actor's update is wrapped (through its
    public method) to record the shapes of each step's batch, and the engine's hooks to
    time them."""
    from memrl.recipes import grpo
    from memrl.tasks.memagent_qa import MemAgentQATask

    rng = random.Random(reward_seed)

    class RandomReward(MemAgentQATask):
        def rollout(self, *a: Any, **kw: Any):
            trajs = super().rollout(*a, **kw)
            return [dataclasses.replace(t, reward=float(rng.random() < 0.5)) for t in trajs]

    run = grpo.setup(config, task=RandomReward(config.memagent))
    return run, record_update_shapes(run), time_engine_hooks(run.engine)


def record_update_shapes(run: Any) -> list[dict[str, Any]]:
    """Wrap the actor's public `update` to record the shapes of each step's batch; returns
    the list a row is appended to at every update (`run_steps` reads its last)."""
    shapes: list[dict[str, Any]] = []
    update = run.actor.update

    def recording_update(batch, *args, **kwargs):
        prompt = [len(s.prompt_ids) for s in batch.conversations]
        resp = [len(s.response_ids) for s in batch.conversations]
        everything = list(range(len(batch.conversations)))
        shapes.append(dict(
            samples=len(prompt), trajectories=batch.num_trajectories,  # this rank's
            trajectories_all_ranks=run.dist.all_reduce_sum(int(batch.num_trajectories)),
            prompt_len_mean=statistics.fmean(prompt), prompt_len_max=max(prompt),
            response_len_mean=statistics.fmean(resp), train_tokens=sum(prompt) + sum(resp),
            response_tokens=sum(resp), prompt_tokens=sum(prompt),
            micro_batches_per_pass=len(run.actor.micro_batches(batch, everything)),
        ))
        return update(batch, *args, **kwargs)

    run.actor.update = recording_update
    return shapes


def time_engine_hooks(engine: Any) -> dict[str, float]:
    """Wrap the engine's public wake / sync_weights / sleep to time each (and read the GPU
    memory in use by every allocator after waking: vLLM's share is not in torch's stats).
    Returns the dict the times accumulate in until `run_steps` takes them for its row."""
    pending: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            sync_cuda()
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            sync_cuda()
            pending[f"{name}_s"] = pending.get(f"{name}_s", 0.0) + time.perf_counter() - t0
            if name == "wake":
                pending["gpu_used_after_wake_gib"] = gpu_memory_used_gib() or 0.0
            return out
        return wrapper

    for name in ("wake", "sync_weights", "sleep"):
        setattr(engine, name, timed(name, getattr(engine, name)))
    return pending


def sync_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_steps(run, shapes, pending: dict[str, float], steps: int) -> list[dict[str, Any]]:
    """`steps` recipe steps; per step its perf/* metrics, batch shapes, the engine hooks'
    times (`pending`, from `time_engine_hooks`), the collector's pauses and peak memory.
    With `trainer.gc_freeze` the heap is frozen after the first step, as the recipe's loop
    (`memrl.run.scaffold.run_loop`) does, and `gc_freeze_s` is that collection's time."""
    from memrl.run.scaffold import HeapFreezer

    rows: list[dict[str, Any]] = []
    with GCPauses() as pauses, HeapFreezer(run.config.trainer.gc_freeze) as heap:
        for i in range(steps):
            froze = {}
            pauses.take()
            if i == 1:  # as the recipe's loop does after the first step
                heap.after_step()
                froze = {"gc_freeze_s": pauses.take()["gc_s"]}
            rows.append({**timed_step(run, pending), **pauses.take(), **froze, **shapes[-1]})
    return rows


def timed_step(run, pending: dict[str, float]) -> dict[str, Any]:
    """One recipe step: its wall time, graphs compiled, perf/* metrics, the engine hooks'
    times (`pending`, then cleared) and peak memory."""
    import torch

    from memrl.recipes import grpo

    cuda = torch.cuda.is_available() and run.actor.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    graphs, t0 = compiled_graphs(), time.perf_counter()
    metrics = grpo.train_step(run)
    if cuda:
        torch.cuda.synchronize()
    run.state.step += 1
    row: dict[str, Any] = {"step": run.state.step, "step_wall_s": time.perf_counter() - t0}
    if graphs is not None:  # a recompilation explains a slow step
        row["graphs_compiled"] = compiled_graphs() - graphs
    row.update({k: metrics[k] for k in PERF_KEYS if k in metrics})
    row.update(pending)
    pending.clear()
    if cuda:
        row["peak_mem_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        row["peak_mem_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        row["gpu_used_end_of_step_gib"] = gpu_memory_used_gib()
    return row


# ---------------------------------------------------------------------------------- summary
PERF_KEYS = (
    "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/step_time_s",
    "perf/sync_s", "perf/rollout_s", "perf/logprobs_s", "perf/update_s",
    "train/samples", "train/chunks_per_episode", "train/memory_update_response_len",
    "train/final_response_len", "train/truncated_frac",
    "rollout/logprob_diff_mean", "rollout/logprob_diff_max",
    "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy",
    "perf/padding_waste", "perf/tokens_per_micro_batch", "perf/update_tflops_per_s", "perf/mfu",
)


def add_derived(rows: list[dict[str, Any]], params: int, with_reference: bool) -> None:
    for row in rows:
        row["rollout_s"], row["logprob_s"] = row["perf/rollout_s"], row["perf/logprobs_s"]
        row["update_s"] = row["perf/update_s"]
        # The breakdown: rollout (generation only) / sync (wake + weights) / sleep /
        # old+ref log-probs / update; `other_s` is the rest of the step (batching, metrics).
        row["sleep_s"] = row.get("sleep_s", 0.0)
        row["generate_s"] = row["rollout_s"] - row["sleep_s"]
        row["weight_sync_s"] = row["perf/sync_s"]
        row["other_s"] = row["perf/step_time_s"] - (
            row["perf/sync_s"] + row["rollout_s"] + row["logprob_s"] + row["update_s"])
        row["conversations_per_trajectory"] = row["samples"] / row["trajectories"]
        # Approximate model FLOPs (6·N per trained token, 2·N per scored token; attention
        # and the autocast weight casts not counted): a yardstick, not a measurement.
        row["approx_update_tflops"] = 6 * params * row["train_tokens"] / row["update_s"] / 1e12
        passes = 2 if with_reference else 1
        row["approx_logprob_tflops"] = (
            2 * params * row["train_tokens"] * passes / row["logprob_s"] / 1e12)
        row["prefill_tokens_per_s"] = row["prompt_tokens"] / row["rollout_s"]


def gpu_seconds_per_trajectory(mean: dict[str, float], world_size: int) -> dict[str, float]:
    """What one trajectory costs in GPU-seconds (a step's wall time x the GPUs, over the
    step's trajectories), and its breakdown: generation, sleep, weight sync, old + reference
    log-probs, update, the rest (batching, metrics; on several GPUs also waiting for the
    slowest rank)."""
    per = world_size / mean["trajectories_all_ranks"]
    parts = {"rollout": mean["generate_s"], "sleep": mean["sleep_s"],
             "weight_sync": mean["weight_sync_s"], "old_ref_logprobs": mean["logprob_s"],
             "update": mean["update_s"], "other": mean["other_s"]}
    return {"total": mean["perf/step_time_s"] * per, **{k: v * per for k, v in parts.items()}}


def mean_rows(rows: list[dict[str, Any]]) -> dict[str, float]:
    # (a key of some steps only, such as gc_freeze_s of the step after the first, stays in
    # the per-step rows: it failed every full-step run on GPUs before, KeyError)
    keys = [k for k in rows[0] if k != "step" and isinstance(rows[0][k], int | float)
            and all(k in r for r in rows)]
    return {k: statistics.fmean(r[k] for r in rows) for k in keys}


def print_table(summary: dict[str, Any]) -> None:
    cols = [("step", "step", "{:d}"), ("samples", "samples", "{:.0f}"),
            ("conv/traj", "conversations_per_trajectory", "{:.2f}"),
            ("prompt", "prompt_len_mean", "{:.0f}"), ("resp", "response_len_mean", "{:.0f}"),
            ("sync s", "weight_sync_s", "{:.2f}"), ("rollout s", "generate_s", "{:.1f}"),
            ("sleep s", "sleep_s", "{:.2f}"), ("logprob s", "logprob_s", "{:.1f}"),
            ("update s", "update_s", "{:.1f}"), ("step s", "step_wall_s", "{:.1f}"),
            ("roll tok/s", "perf/rollout_tokens_per_s", "{:.0f}"),
            ("train tok/s", "perf/train_tokens_per_s", "{:.0f}"),
            ("waste", "perf/padding_waste", "{:.3f}"),
            ("MFU", "perf/mfu", "{:.3f}"),
            ("peak GiB", "peak_mem_allocated_gib", "{:.1f}"),
            ("graphs", "graphs_compiled", "{:d}"), ("gc s", "gc_s", "{:.2f}")]
    print(" | ".join(name for name, _, _ in cols))
    for row in summary["steps"]:
        cells = []
        for _, key, fmt in cols:
            v = row.get(key)
            cells.append("-" if v is None else fmt.format(v))
        print(" | ".join(cells))
    m = summary["mean_excluding_warmup"]
    print(f"mean of steps {summary['measured_steps']}: rollout "
          f"{m['perf/rollout_tokens_per_s']:.0f} tok/s, train "
          f"{m['perf/train_tokens_per_s']:.0f} tok/s, step {m['step_wall_s']:.1f} s"
          + (f", peak {m['peak_mem_allocated_gib']:.1f} GiB" if "peak_mem_allocated_gib" in m
             else ""))


# ---------------------------------------------------------------------------------- update only
def synthetic_batch(args: argparse.Namespace, vocab: int, rank: int = 0):
    """`--samples` conversations of uniformly drawn prompt and response lengths (random ids),
    one per trajectory, four trajectories per question, random 0/1 rewards and ±1
    advantages: the shapes of MemAgent's memory-update and final turns, without a rollout.
    Each rank of a data-parallel run draws its own (seeded with the seed and its rank)."""
    import torch

    from memrl.rl.maths.batch import RolloutBatch
    from memrl.trajectory import Trajectory, Turn

    rng = random.Random(args.seed if rank == 0 else f"{args.seed}/rank{rank}")
    trajs = []
    for i in range(args.samples):
        p, r = rng.randint(*args.prompt_len), rng.randint(*args.response_len)
        response = [rng.randrange(vocab) for _ in range(r)]
        turn = Turn(kind="memory_update", prompt_ids=[rng.randrange(vocab) for _ in range(p)],
                    response_ids=response, response_logprobs=[-1.0] * r, response_text="")
        trajs.append(Trajectory(record_id=f"r{rank}q{i // 4}", sample_index=i % 4, turns=[turn],
                                reward=float(rng.random() < 0.5)))
    batch = RolloutBatch.from_trajectories(trajs, overlong="keep")
    advantages = torch.tensor([1.0 if t.reward else -1.0 for t in trajs])
    return batch, advantages


def run_update_only(args: argparse.Namespace, shape: dict[str, int],
                    argv: list[str] | None) -> dict[str, Any]:
    """Per micro-batch token budget: `--steps` rounds of old log-probs + one PPO update (one
    optimizer step over the whole batch); the first `--warmup` rounds are left out."""
    import torch

    from memrl.distributed import init_process_group
    from memrl.rl.maths.flops import ModelShape, device_peak_flops, train_flops
    from memrl.rl.trainer.actor import build_optimizer

    fsdp = args.strategy == "fsdp"
    # Under torchrun: one rank per GPU (cuda:LOCAL_RANK), each with its own `--samples`
    # conversations (weak scaling: the same work per GPU), gradients summed over the ranks
    # (replicate) or reduce-scattered (FSDP2). One process: a group only for FSDP2.
    dist = init_process_group(1800, device=args.device, always=fsdp)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
    model, sharding = build_update_model(args, shape, dist, device)
    model_shape = ModelShape.of(model)
    params = sum(p.numel() for p in model.parameters())
    autocast = torch.bfloat16 if cuda else None
    peak = (args.peak_tflops * 1e12 if args.peak_tflops
            else device_peak_flops(device, autocast))
    optimizer = build_optimizer(model, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0)
    batch, advantages = synthetic_batch(args, shape["vocab_size"], rank=dist.rank)
    lens = [s.num_tokens for s in batch.conversations]
    responses = [len(s.response_ids) for s in batch.conversations]
    tokens = sum(lens)
    # Model FLOPs of the update (memrl.rl.maths.flops, per sequence) and the classic 6·N·T
    # yardstick (N = every parameter, the vocabulary projection at every token, no attention).
    flops = train_flops(lens, model_shape, logit_tokens=sum(responses))
    flops_6n = 6 * params * tokens
    all_tokens, all_flops, all_flops_6n = (float(dist.all_reduce_sum(float(x)))
                                           for x in (tokens, flops, flops_6n))
    prompts = [n - r for n, r in zip(lens, responses, strict=True)]
    if dist.is_main:
        print(f"model {params / 1e6:.1f}M params ({args.attn}), {len(lens)} conversations, "
              f"{tokens} tokens (prompts {min(prompts)}–{max(prompts)}, responses "
              f"{min(responses)}–{max(responses)}), remove_padding={args.remove_padding}",
              flush=True)

    totals = {"tokens": all_tokens, "flops": all_flops, "flops_6n": all_flops_6n}
    rows = []
    for budget in args.budgets:
        row = measure_budget(args, budget, model, optimizer, batch, advantages, dist,
                             cuda=cuda, peak=peak, autocast=autocast, sharding=sharding,
                             totals=totals)
        rows.append(row)
        if "error" in row:  # a budget too large for the GPU: say so, go on
            print(json.dumps(row), flush=True)
        elif dist.is_main:
            print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
    summary = {
        "benchmark": "memrl PPO update on MemAgent-shaped batches",
        "world_size": dist.world_size,
        "environment": environment(),
        "argv": sys.argv[1:] if argv is None else argv,
        "model": {**shape, "params": params, "body_params": model_shape.body_params},
        "settings": update_settings(args, lens, responses, totals, flops=flops,
                                    flops_6n=flops_6n, peak=peak, cuda=cuda),
        "budgets": rows,
    }
    if dist.is_main:
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
        print_budget_table(rows)
    dist.barrier()  # every rank done before any leaves the group (main() leaves it)
    return summary


def update_settings(args: argparse.Namespace, lens: list[int], responses: list[int],
                    totals: dict[str, float], *, flops: float, flops_6n: float, peak: float,
                    cuda: bool) -> dict[str, Any]:
    """The summary's `settings` of an update-only run: how it ran and on what (rank 0's
    conversations, `totals` over every rank)."""
    return {
        "attn_implementation": args.attn, "remove_padding": args.remove_padding,
        "gradient_checkpointing": args.gradient_checkpointing,
        "checkpoint_every_n_layers": args.checkpoint_every, "compile": args.compile,
        "strategy": args.strategy, "samples": len(lens),  # per rank
        "prompt_len": list(args.prompt_len),
        "response_len": list(args.response_len), "tokens": sum(lens),  # rank 0's
        "tokens_all_ranks": totals["tokens"],
        "response_tokens": sum(responses), "sum_sq_seq_len": sum(n * n for n in lens),
        "update_model_flops": flops, "update_6n_flops": flops_6n,
        "peak_flops": peak, "steps_per_budget": args.steps, "warmup_steps": args.warmup,
        "dtype": ("fp32 master weights, bf16 autocast" + (
            ", FSDP2 MixedPrecisionPolicy: bf16 parameters, fp32 reduction"
            if args.strategy == "fsdp" else "")) if cuda else "float32",
    }


def build_update_model(args: argparse.Namespace, shape: dict[str, int], dist: Any,
                       device: Any) -> tuple[Any, dict[str, Any]]:
    """The random-weight model of `--update-only` in training mode, with the attention,
    packing, checkpointing, compilation and sharding the recipe would give it (`args.attn`
    and `args.remove_padding` set to what they resolved to), and the Actor's sharding
    arguments."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from memrl.models.attention import uses_varlen
    from memrl.recipes.config import ModelConfig
    from memrl.recipes.models import attention, checkpoint_layers, compile_layers
    from memrl.rl.trainer.sharding import shard

    fsdp = args.strategy == "fsdp"
    config = Qwen2Config(**{"tie_word_embeddings": True, **shape}, rope_theta=1_000_000.0)
    torch.manual_seed(args.seed)
    # model.attn_implementation and rl.remove_padding resolved as the recipe resolves them
    impl = attention(ModelConfig(path="random", device=str(device),
                                 attn_implementation=args.attn))
    with torch.device("cpu") if fsdp else device:  # shard() moves each unit to the device
        model = AutoModelForCausalLM.from_config(config, **impl)
    args.attn = "varlen" if uses_varlen(model) else model.config._attn_implementation
    if args.remove_padding == "auto":
        args.remove_padding = uses_varlen(model)
    if args.gradient_checkpointing:
        checkpoint_layers(model, every_n_layers=args.checkpoint_every, fsdp=fsdp)
    if args.compile:
        compile_layers(model)
    sharding: dict[str, Any] = {}
    if fsdp:  # alone too: FSDP2 for its mixed-precision policy (one bf16 cast per layer)
        model = shard(model, device, param_dtype=torch.bfloat16 if device.type == "cuda"
                      else None)
        sharding = dict(sharded_over=dist, device=device)
    model.train()
    return model, sharding


def measure_budget(args: argparse.Namespace, budget: int, model: Any, optimizer: Any,
                   batch: Any, advantages: Any, dist: Any, *, cuda: bool, peak: float | None,
                   autocast: Any, sharding: dict[str, Any],
                   totals: dict[str, float]) -> dict[str, Any]:
    """One row of `--update-only`: an Actor with micro-batches of at most `budget` tokens,
    `--steps` rounds of old log-probs + one update timed (the first `--warmup` left out),
    throughput, MFU and peak memory over every rank (`totals`: tokens, flops, flops_6n of
    all ranks); a budget too large for the GPU is a row with its error."""
    import torch

    from memrl.rl.config import RLConfig
    from memrl.rl.maths.flops import mfu
    from memrl.rl.trainer.actor import Actor, warmup_schedule

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    n = len(batch.conversations)
    rl = RLConfig(use_kl_loss=False, ppo_mini_batch_size=n,
                  use_dynamic_bsz=True, max_tokens_per_micro_batch=budget,
                  remove_padding=args.remove_padding, overlong="keep")
    actor = Actor(model, rl, optimizer=optimizer, scheduler=warmup_schedule(optimizer, 0),
                  grad_clip=1.0, peak_flops=peak, pad_id=0, autocast_dtype=autocast,
                  **sharding)
    micro = actor.micro_batches(batch, list(range(n)))
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times = []
    try:
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            old = actor.logprobs(batch)
            sync()
            t1 = time.perf_counter()
            stats = actor.update(batch.with_logprobs(old).with_advantages(advantages), dist)
            sync()
            times.append((t1 - t0, time.perf_counter() - t1))
    except torch.OutOfMemoryError:
        if dist.world_size > 1:  # the other ranks wait in a collective: end the run
            raise
        optimizer.zero_grad(set_to_none=True)
        return {"budget": budget, "micro_batches": len(micro), "error": "out of memory"}
    # the slowest rank's time (every rank waits for it in the collectives)
    logprob_s = max(dist.all_gather(statistics.fmean(t for t, _ in times[args.warmup:])))
    update_s = max(dist.all_gather(statistics.fmean(u for _, u in times[args.warmup:])))
    all_tokens, all_flops = totals["tokens"], totals["flops"]
    row: dict[str, Any] = {
        "budget": budget, "micro_batches": len(micro),
        "tokens_per_micro_batch": stats.tokens_per_micro_batch,
        "padding_waste": stats.padding_waste,
        "logprob_s": logprob_s, "update_s": update_s,
        # all ranks together, and per GPU
        "logprob_tokens_per_s": all_tokens / logprob_s,
        "update_tokens_per_s": all_tokens / update_s,
        "update_tokens_per_s_per_gpu": all_tokens / update_s / dist.world_size,
        "update_model_tflops_per_s": all_flops / update_s / 1e12,
    }
    if peak:  # per GPU: this rank's work over the step's time, the mean of the ranks'
        row["mfu"] = mfu(all_flops / dist.world_size, update_s, peak)
        row["mfu_6n"] = mfu(totals["flops_6n"] / dist.world_size, update_s, peak)
        row["logprob_mfu"] = mfu(all_flops / 3 / dist.world_size, logprob_s, peak)
    if cuda:  # the largest of the ranks'
        row["peak_mem_allocated_gib"] = max(dist.all_gather(
            torch.cuda.max_memory_allocated() / 2**30))
        row["peak_mem_reserved_gib"] = max(dist.all_gather(
            torch.cuda.max_memory_reserved() / 2**30))
    if args.profile:
        row["profile"] = profile_call(
            lambda: actor.update(batch.with_logprobs(old).with_advantages(advantages), dist),
            cuda=cuda)
        if dist.is_main:
            print(row["profile"].get("top_self_cuda") or row["profile"]["top_self_cpu"],
                  flush=True)
    if args.sync_debug and cuda:
        row["host_syncs"] = count_host_syncs(
            lambda: actor.update(batch.with_logprobs(old).with_advantages(advantages), dist))
    return row


def print_budget_table(rows: list[dict[str, Any]]) -> None:
    cols = [("budget", "budget", "{:d}"), ("micro", "micro_batches", "{:d}"),
            ("tok/micro", "tokens_per_micro_batch", "{:.0f}"),
            ("waste", "padding_waste", "{:.3f}"),
            ("logprob tok/s", "logprob_tokens_per_s", "{:.0f}"),
            ("update tok/s", "update_tokens_per_s", "{:.0f}"),
            ("TFLOP/s", "update_model_tflops_per_s", "{:.3g}"),
            ("MFU", "mfu", "{:.3f}"), ("MFU 6N", "mfu_6n", "{:.3f}"),
            ("peak GiB", "peak_mem_allocated_gib", "{:.1f}")]
    print(" | ".join(name for name, _, _ in cols))
    for row in rows:
        cells = ["-" if row.get(k) is None else f.format(row[k]) for _, k, f in cols]
        print(" | ".join(cells) + (f" | {row['error']}" if "error" in row else ""))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out_dir)
    if not args.update_only and os.environ.get("RANK", "0") == "0" and out.exists():
        shutil.rmtree(out)  # before the run record goes in
    record_at = args.json_out or (None if args.update_only else str(out))
    from memrl.distributed import destroy_process_group

    try:
        with run_record(record_at, "train_step_gpu", args, engine=args.engine,
                        strategy=args.strategy, device=args.device):
            return run(args, argv)
    finally:  # every rank leaves the group it joined, after an error too: none exits in it
        destroy_process_group()


def run(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    import torch

    from memrl.data.synthetic import synthetic_corpus

    env = environment()
    print_environment(env)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.device = device
    shape = dict(TINY if args.tiny else SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    if args.update_only:
        return run_update_only(args, shape, argv)
    from memrl.distributed import init_process_group

    # Under torchrun: one rank per GPU (cuda:LOCAL_RANK); rank 0 builds model and data.
    dist = init_process_group(1800, device=device)
    out = Path(args.out_dir)
    t0 = time.perf_counter()
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        model_info = build_model_dir(
            out / "model", shape, tokenizer_vocab=args.tokenizer_vocab,
            pad_tokenizer=not args.no_pad_tokenizer, corpus=synthetic_corpus(args.seed, 200),
            seed=args.seed, device=device)
        write_data(out / "train.jsonl", args)
        (out / "model_info.json").write_text(json.dumps(model_info))
    dist.barrier()
    model_info = json.loads((out / "model_info.json").read_text())
    t_build = time.perf_counter() - t0
    print(f"model {model_info['params'] / 1e6:.1f}M params, {args.num_questions} questions, "
          f"built in {t_build:.1f} s", flush=True)

    config = make_config(args, out / "model", out / "train.jsonl", out / "run")
    t0 = time.perf_counter()
    run, shapes, pending = make_run(config, args.seed)
    t_setup = time.perf_counter() - t0
    print(f"recipe setup (policy + reference load) {t_setup:.1f} s", flush=True)
    t0 = time.perf_counter()
    rows = run_steps(run, shapes, pending, args.steps)
    if args.keep_checkpoint:
        from memrl.recipes import grpo

        grpo.save(run)
    t_fit = time.perf_counter() - t0
    add_derived(rows, model_info["params"], run.reference is not None)
    measured = rows[args.warmup:]
    summary = {
        "benchmark": "memrl MemAgent RL training step",
        "environment": env,
        "argv": sys.argv[1:] if argv is None else argv,
        "model": model_info,
        "settings": recipe_settings(args, config, run),
        "timing_s": {"build_model_and_data": t_build, "recipe_setup": t_setup,
                     "steps": t_fit},
        "warmup_steps": args.warmup,
        "measured_steps": [r["step"] for r in measured],
        "steps": rows,
        "mean_excluding_warmup": mean_rows(measured),
    }
    summary["world_size"] = dist.world_size
    summary["gpu_seconds_per_trajectory"] = gpu_seconds_per_trajectory(
        summary["mean_excluding_warmup"], dist.world_size)
    ranks = dist.all_gather({"rank": dist.rank, "peak_mem_allocated_gib": max(
        (r.get("peak_mem_allocated_gib", 0.0) for r in rows), default=0.0)})
    summary["peak_mem_allocated_gib_per_rank"] = [r["peak_mem_allocated_gib"] for r in ranks]
    if dist.is_main:
        text = json.dumps(summary, indent=2)
        (out / "summary.json").write_text(text + "\n")
        if args.json_out:
            Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json_out).write_text(text + "\n")
        print(text)
        print_table(summary)
    run.engine.close()  # vLLM's shutdown needs the process group: before main() leaves it
    dist.barrier()  # every rank done before any leaves the group (main() leaves it)
    return summary


def recipe_settings(args: argparse.Namespace, config: Any, run: Any) -> dict[str, Any]:
    """The settings of a recipe-mode run, as its summary reports them."""
    device = args.device
    return {
        "gradient_checkpointing": args.gradient_checkpointing,
        "checkpoint_every_n_layers": args.checkpoint_every, "compile": args.compile,
        "old_logprobs": args.old_logprobs,
        "engine": args.engine, "recipe_shapes": args.recipe_shapes,
        "strategy": args.strategy,
        "rollout_vllm": config.rollout.vllm.model_dump() if args.engine == "vllm" else None,
        "chunk_size": args.chunk_size, "max_memory_tokens": args.max_memory_tokens,
        "max_final_tokens": args.max_final_tokens, "rollout_n": args.rollout_n,
        "train_batch_size": args.train_batch_size,
        "ppo_mini_batch_size": config.rl.ppo_mini_batch_size,
        "use_kl_loss": config.rl.use_kl_loss, "kl_loss_type": config.rl.kl_loss_type,
        "use_dynamic_bsz": True, "remove_padding": args.remove_padding,
        "attn_implementation": args.attn,
        # what `auto` resolved to: the policy's attention kernel, packed or padded
        "attn_implementation_used": getattr(run.actor.model.config,
                                            "_attn_implementation", None),
        "packed": run.actor.packed,
        "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch,
        "generation_batch_size": args.generation_batch_size,
        "temperature": args.temperature, "top_p": args.top_p,
        "dtype": "fp32 master weights, bf16 autocast"
        if device.startswith("cuda") else "float32",
        "reward": "random 0/1", "dynamic_sampling": False, "overlong": "keep",
        "docs_per_question": [args.docs_min, args.docs_max],
    }


if __name__ == "__main__":
    main()

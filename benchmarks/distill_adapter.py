"""Distil a fully fine-tuned model into an adapter of rank r on its base, on the logits.

A truncated SVD keeps the directions most of a weight difference lies in, not those the
model's behaviour needs (memagent_adapter_gpu.py: the warm start's rank-16 difference scores
7 points under the warm start). This trains the adapter for the behaviour instead:

    adapter = extract_adapter(base, tuned, rank)        every matrix's rank-r SVD: the start
    student = base + B @ A (every matrix) + vectors     the factors and vectors trainable
    for each step:  16 of the warm start's trajectories (its SFT data: the oracle's, same seed)
        loss = KL(tuned || student) at every response token, token mean of the step
    adapter = extract_adapter(base, student, rank)      balanced factors of the same product

The student's weights are rounded to the base's dtype (bfloat16) in the forward, as
`apply_adapter` rounds the model `init-model` writes. Its file is a `memrl.models.adapters`
adapter (`low-rank-diff/1`), the same size as the SVD's of the same rank: the trained product
B @ A in float32, re-factored. The KL over held-out trajectories (the last `--val`, not
distilled on; the teacher was trained on them) is printed before and after.

    python benchmarks/distill_adapter.py --base WORK/model --tuned WORK/model_warm \
        --rank 27 --lr 1e-4 --out WORK/d27.safetensors \
        configs/smollm2_memagent_sft.yaml model.path=WORK/model data.train_file=WORK/data/train.jsonl

The config and overrides are the warm start's `memrl sft` ones (its data, chunking, prompts,
oracle, batch size, optimizer schedule); `--steps` (default: the warm start's, trainer.total_steps
or its epochs).
`--tiny`: the tiny test model trained briefly against a perturbed copy, on CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, print_environment  # noqa: E402

from memrl.config import load_config  # noqa: E402
from memrl.inference.loader import load_tokenizer  # noqa: E402
from memrl.models.adapters import apply_adapter, extract_adapter, save_adapter  # noqa: E402
from memrl.recipes import models  # noqa: E402
from memrl.recipes.sft import sft_total_steps, teacher_trajectories  # noqa: E402
from memrl.recipes.sft_config import SFTConfig  # noqa: E402
from memrl.rl.maths.batch import RolloutBatch  # noqa: E402
from memrl.rl.trainer.logprobs import gather_rows  # noqa: E402
from memrl.rl.trainer.optim import build_optimizer, optimizer_step  # noqa: E402


def load_model(path: Path, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    return model


def weights(model) -> dict[str, torch.Tensor]:
    """Every parameter in float32, tied ones once (under the name listed first)."""
    return {name: p.detach().float() for name, p in model.named_parameters()}


class Student(torch.nn.Module):
    """`base` plus trainable factors (B @ A per matrix) and vector differences, each weight
    rounded to the base's dtype as `apply_adapter` writes it."""

    def __init__(self, model, adapter: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.base = {n: p for n, p in model.named_parameters()}
        device = next(model.parameters()).device
        self.names = sorted({k[: k.rindex(".")] for k in adapter})
        self.factors = torch.nn.ParameterDict()
        for i, name in enumerate(self.names):
            for part in ("lora_B", "lora_A", "delta"):
                if f"{name}.{part}" in adapter:
                    self.factors[f"{part}{i}"] = torch.nn.Parameter(
                        adapter[f"{name}.{part}"].to(device, torch.float32).clone())
        decoder = model.get_decoder()
        prefix = {id(m): n for n, m in model.named_modules()}[id(decoder)]
        self.decoder, self.prefix = decoder, prefix + "." if prefix else ""
        head = model.get_output_embeddings()
        self.head_name = {id(p): n for n, p in model.named_parameters()}[id(head.weight)]

    def delta(self, i: int) -> torch.Tensor:
        """Weight `i`'s change in float32 (B @ A computed in float32, as `apply_adapter`
        computes it, also under autocast)."""
        if f"delta{i}" in self.factors:
            return self.factors[f"delta{i}"]
        with torch.autocast(self.base[self.names[i]].device.type, enabled=False):
            return self.factors[f"lora_B{i}"] @ self.factors[f"lora_A{i}"]

    def current(self) -> dict[str, torch.Tensor]:
        """The student's weights as the model `init-model` writes holds them: base + change,
        rounded to the base's dtype."""
        return {name: (self.base[name].float() + self.delta(i)).to(self.base[name].dtype)
                for i, name in enumerate(self.names)}

    def logits(self, inputs: dict[str, torch.Tensor], select: torch.Tensor) -> torch.Tensor:
        """Logits at the `select`ed positions only (the response tokens)."""
        new = self.current()
        params = {n[len(self.prefix):]: w for n, w in new.items() if n.startswith(self.prefix)}
        hidden = torch.func.functional_call(self.decoder, params, args=(),
                                            kwargs={**inputs, "use_cache": False})
        head = new.get(self.head_name, self.base[self.head_name])
        return F.linear(gather_rows(hidden.last_hidden_state, select), head)


def teacher_logits(model, inputs: dict[str, torch.Tensor], select: torch.Tensor) -> torch.Tensor:
    hidden = model.get_decoder()(**inputs, use_cache=False).last_hidden_state
    return model.get_output_embeddings()(gather_rows(hidden, select))


def kl_sum(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """Sum over rows of KL(softmax(teacher) || softmax(student)), in float32."""
    t = F.log_softmax(teacher.float(), -1)
    s = F.log_softmax(student.float(), -1)
    return (t.exp() * (t - s)).sum()


def batches(trajs, batch_size: int, seed: int):
    """Endless batches of `batch_size` trajectories, shuffled every epoch (by seed, epoch)."""
    epoch = 0
    while True:
        order = list(range(len(trajs)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield [trajs[i] for i in order[start:start + batch_size]]
        epoch += 1


def step_kl(student: Student, teacher, trajs, micro: int, pad_id: int, device: str,
            dtype: torch.dtype, *, backward: bool) -> tuple[float, int]:
    """The token-mean KL of these trajectories' response tokens (its gradient with
    `backward`); (KL, response tokens)."""
    batch = RolloutBatch.from_trajectories(trajs, overlong="keep")
    tokens = sum(c.num_loss_tokens for c in batch.conversations)
    total, n = 0.0, len(batch.conversations)
    autocast = torch.autocast("cuda", dtype=dtype) if device == "cuda" else torch.autocast(
        "cpu", enabled=False)
    for start in range(0, n, micro):
        tensors = batch.collate(range(start, min(start + micro, n)), pad_id)
        inputs = {k: tensors[k].to(device) for k in ("input_ids", "attention_mask",
                                                     "position_ids")}
        select = tensors["loss_mask"]
        with autocast:
            with torch.no_grad():
                target = teacher_logits(teacher, inputs, select)
            with torch.set_grad_enabled(backward):
                part = kl_sum(target, student.logits(inputs, select)) / max(tokens, 1)
        if backward:
            part.backward()
        total += float(part.detach())
    return total, tokens


def arguments() -> argparse.Namespace:
    """The command line, checked: one line (exit 2) for what it cannot take."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", help="the warm start's memrl sft config")
    parser.add_argument("overrides", nargs="*", help="its dotted overrides")
    parser.add_argument("--base", type=Path)
    parser.add_argument("--tuned", type=Path)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps (default: the warm start's)")
    parser.add_argument("--val", type=int, default=16,
                        help="trajectories held out of training for the KL printed")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--metadata", action="append", default=[],
                        help="KEY=VALUE for the adapter file's metadata (repeatable)")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="the models' weights (auto: bfloat16 on a GPU, float32 on a CPU)")
    parser.add_argument("--tiny", action="store_true", help="a CPU check on the tiny model")
    args = parser.parse_args()
    if args.tiny and (args.base or args.tuned or args.config):
        parser.error("--tiny builds its own models and config: give none")
    if not args.tiny and not (args.base and args.tuned and args.config):
        parser.error("--base, --tuned and the config are needed (or --tiny)")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.rank < 1 or not args.lr > 0:
        parser.error("--rank must be at least 1 and --lr above 0")
    bad = [item for item in args.metadata if "=" not in item]
    if bad:
        parser.error(f"--metadata takes KEY=VALUE, got {bad[0]!r}")
    return args


def distil(student: Student, teacher, train, val, cfg: SFTConfig, lr: float, steps: int,
           pad_id: int, device: str, dtype: torch.dtype) -> dict:
    """`steps` optimizer steps on the KL to the teacher; the report (held-out KL before and
    after, every step's KL and gradient norm)."""
    optimizer = build_optimizer(student.factors, lr=lr, betas=cfg.optim.betas, weight_decay=0.0)
    scheduler = models.lr_schedule(optimizer, cfg.optim.model_copy(update={"lr": lr}), steps)
    micro, batch_size = cfg.sft.micro_batch_size, cfg.sft.batch_size
    report = {"lr": lr, "steps": steps, "train_trajectories": len(train),
              "val_trajectories": len(val), "log": []}
    if val:
        report["val_kl_start"] = step_kl(student, teacher, val, micro, pad_id, device, dtype,
                                         backward=False)[0]
        print(f"held-out KL at the SVD's factors: {report['val_kl_start']:.4f}", flush=True)
    stream, t0 = batches(train, min(batch_size, len(train)), cfg.seed), time.perf_counter()
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        kl, tokens = step_kl(student, teacher, next(stream), micro, pad_id, device, dtype,
                             backward=True)
        grad_norm = optimizer_step(student.factors, optimizer, cfg.optim.grad_clip,
                                   scheduler=scheduler)
        row = {"step": step, "kl": kl, "tokens": tokens, "grad_norm": grad_norm,
               "elapsed_s": round(time.perf_counter() - t0, 1)}
        report["log"].append(row)
        if step == 1 or step % 10 == 0 or step == steps:
            print(json.dumps(row), flush=True)
    if val:
        report["val_kl_end"] = step_kl(student, teacher, val, micro, pad_id, device, dtype,
                                       backward=False)[0]
        print(f"held-out KL after {steps} steps: {report['val_kl_end']:.4f} "
              f"(from {report['val_kl_start']:.4f})", flush=True)
    return report


def save_distilled(student: Student, base_model, rank: int, out: Path, metadata: dict,
                   device: str) -> float:
    """The trained product (float32, unrounded) re-factored to rank `rank` and written as a
    memrl adapter at `out`; how far the file's float16 factors are from that product (the
    largest relative error of a weight's change)."""
    with torch.no_grad():
        base = {n: w.cpu() for n, w in weights(base_model).items()}
        final = {**base, **{n: base[n] + student.delta(i).float().cpu()
                            for i, n in enumerate(student.names)}}
        distilled = extract_adapter(base, final, rank, device=device)
    save_adapter(distilled, out, metadata)
    again = dict(base)
    apply_adapter(again, distilled)
    return max(float((again[n] - final[n]).norm()
                     / max(float((final[n] - base[n]).norm()), 1e-12)) for n in student.names)


def main() -> None:
    args = arguments()
    metadata = dict(item.split("=", 1) for item in args.metadata)
    print_environment(environment())
    if args.tiny:
        args.base, args.tuned, args.config, args.overrides = tiny_setup(args.out.parent)
    cfg = load_config(SFTConfig, args.config, args.overrides)
    torch.manual_seed(cfg.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(
        args.dtype, torch.bfloat16 if device == "cuda" else torch.float32)

    teacher = load_model(args.tuned, dtype, device)
    base_model = load_model(args.base, dtype, device)
    adapter = extract_adapter(weights(base_model), weights(teacher), args.rank, device=device)
    student = Student(base_model, adapter)
    tokenizer = load_tokenizer(str(args.base))
    trajs = teacher_trajectories(cfg, tokenizer, cfg.data.train_file, what="training")
    val, train = trajs[-args.val:] if args.val else [], trajs[:len(trajs) - args.val]
    if not train:
        raise SystemExit(f"{len(trajs)} trajectories leave none to train on after --val")
    steps = args.steps if args.steps is not None else sft_total_steps(cfg, len(train))
    report = {"rank": args.rank, **distil(student, teacher, train, val, cfg, args.lr, steps,
                                          models.pad_token_id(tokenizer), device, dtype)}
    report["refactor_error"] = save_distilled(student, base_model, args.rank, args.out, {
        **metadata, "memrl.distilled": f"rank {args.rank}, lr {args.lr}, {steps} steps",
        "memrl.val_kl": f"{report.get('val_kl_start', 0):.4f} -> "
                        f"{report.get('val_kl_end', 0):.4f}"}, device)
    report["bytes"] = args.out.stat().st_size
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"adapter: {args.out} ({report['bytes'] / 1e6:.1f} MB)", flush=True)


def tiny_setup(work: Path) -> tuple[Path, Path, str, list[str]]:
    """The tiny test model as the base, a copy with every weight nudged as the tuned model,
    a few biographies questions: a CPU check that the loop runs and the KL falls."""
    from transformers import AutoModelForCausalLM

    from memrl.data.biographies.build import write_biographies
    from memrl.models.tiny import build_tiny_model

    work.mkdir(parents=True, exist_ok=True)
    base = build_tiny_model(work / "base")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    model.save_pretrained(work / "tuned")
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "special", "vocab", "merges")):
            (work / "tuned" / f.name).write_bytes(f.read_bytes())
    write_biographies(work / "data", split="train", train_questions=10, train_docs=4,
                      val_questions=0)
    return base, work / "tuned", None, [
        f"model.path={base}", f"data.train_file={work / 'data' / 'train.jsonl'}",
        "memagent.chunk_size=64", "memagent.max_memory_tokens=32",
        "memagent.max_final_tokens=16", "sft.batch_size=4", "sft.micro_batch_size=8",
        "trainer.total_steps=8", "optim.warmup_steps=0"]


if __name__ == "__main__":
    main()

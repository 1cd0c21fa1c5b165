"""How small can the shipped SmolLM2 MemAgent be? Its warm start kept as an adapter.

`memrl init-model smollm2-135m-memagent` writes the published plan's warm start from an
adapter inside memrl (`memrl.models.trained`): the trained weights' difference from the base,
every matrix kept to rank r by a truncated SVD (`rN`), as the signs of the difference with
one scale a row (`sign`: one bit a weight), or both (`rN+sign`: the signs of what rank N
leaves; `memrl.models.adapters`), or rank N trained for the behaviour (`dN@LR`: the rank-N
SVD's factors distilled on the warm start's logits over its own SFT data, learning rate LR;
`distill_adapter.py`, one process a GPU). This measures which keeps the model's scores, on
one GPU host:

    1. real_model_gpu.py's `--plan adapter`, row warm_start: the base model (`memrl
       init-model smollm2-135m-instruct`), the data, the published-format corrective warm
       start (`memrl sft` + `memrl export`) and its evaluations: biographies 1x and 16x,
       RULER-HQA 1x, published protocol (`memrl eval`, a ruler-hqa entry with protocol memagent);
    2. for each adapter: its extraction from the warm start against the base model
       (`extract_adapter`), the model directory `init-model` would write from it
       (`write_adapted_model`: the base de-quantized from its GGUF again, the adapter added),
       and the same evaluations of it, side by side;
    3. OUT/adapter_report.{json,md}: every adapter's scores beside the full model's, its
       size, and the smallest at most `--tolerance` points under the full model at every
       evaluation and at most `--size-limit` bytes; the adapters in OUT/adapters/.

    python benchmarks/memagent_adapter_gpu.py --work /tmp/ad --out /tmp/ad/out --adapters r16,sign,r2+sign
    python benchmarks/memagent_adapter_gpu.py --work /tmp/ad --out /tmp/ad/out --gpus 4 \
        --adapters r27,d27@5e-5,d27@2e-4,d16@2e-4      # distilled adapters, 4 GPUs
    python benchmarks/memagent_adapter_gpu.py --work /tmp/al --out /tmp/al/out --adapters r32 \
        --sft-override model.lora.enabled=true --sft-override model.lora.r=32 \
        --sft-override model.lora.alpha=64 --sft-override optim.lr=2e-4   # a LoRA warm start

`--ranks 8,16,32` is `--adapters r8,r16,r32`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import environment, print_environment, shared_data_file  # noqa: E402
from real_model_gpu import (  # noqa: E402
    PLANS,
    Runner,
    evaluations,
    pipeline,
    prepare_data,
    row_results,
    start_evaluations,
    trained_protocol,
)

BASE = "smollm2-135m-instruct"
TITLE = "SmolLM2-135M MemAgent (memrl)"


def weights_of(model_dir: Path, device: str) -> dict:
    """Every parameter of a model directory in float32, tied ones once."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {name: p.detach().to(device) for name, p in model.named_parameters()}


def parse_adapter(spec: str) -> tuple[int, bool]:
    """(rank, sign) of an adapter named like `r16`, `sign` or `r4+sign` (a distilled one,
    `dN` / `dN@LR`: its rank, no signs)."""
    distilled = parse_distilled(spec)
    if distilled is not None:
        return distilled[0], False
    rank, sign = 0, False
    for part in spec.split("+"):
        if part == "sign":
            sign = True
        elif part[:1] == "r" and part[1:].isdigit() and int(part[1:]) > 0:
            rank = int(part[1:])
        else:
            raise SystemExit(f"--adapters: {spec!r} is not rN, sign, rN+sign, dN or dN@LR")
    return rank, sign


def parse_distilled(spec: str) -> tuple[int, float] | None:
    """(rank, learning rate) of a distilled adapter named like `d27` or `d27@2e-4`
    (`distill_adapter.py`; lr default 1e-4); None for any other spec."""
    if spec[:1] != "d":
        return None
    rank, _, lr = spec[1:].partition("@")
    try:
        value = float(lr) if lr else 1e-4
    except ValueError:
        value = -1.0
    if not rank.isdigit() or int(rank) < 1 or not value > 0:
        raise SystemExit(f"--adapters: {spec!r} is not dN or dN@LR (rank N >= 1, LR > 0)")
    return int(rank), value


def name_of(spec: str) -> str:
    """The file and row name of an adapter spec (`r2+sign` -> r2_sign, `d27@2e-4` ->
    d27_lr2e-4)."""
    return spec.replace("+", "_").replace("@", "_lr")


def row_of(spec: str) -> str:
    return "adapter_" + name_of(spec)


def distill(plan, work: Path, out: Path, specs: list[str], commit: str, hotpotqa: Path | None,
            steps: int | None) -> None:
    """OUT/adapters/<name>.safetensors of every distilled spec (`dN@LR`), side by side, each
    on the next GPU in turn (`distill_adapter.py`, on the warm start's SFT config and data)."""
    todo = [s for s in specs if parse_distilled(s) is not None
            and not (out / "adapters" / f"{name_of(s)}.safetensors").is_file()]
    if not todo:
        return
    data = prepare_data(plan, Runner(work), work / "data", hotpotqa)
    runner = Runner(work, program=(sys.executable, str(Path(__file__).parent /
                                                       "distill_adapter.py")))
    jobs = []
    for i, spec in enumerate(todo):
        rank, lr = parse_distilled(spec)
        jobs.append(runner.start(
            f"distill_{name_of(spec)}", "--base", str(work / "model"),
            "--tuned", str(work / "model_warm"), "--rank", str(rank), "--lr", str(lr),
            *(["--steps", str(steps)] if steps else []),
            "--out", str(out / "adapters" / f"{name_of(spec)}.safetensors"),
            "--metadata", f"memrl.title={TITLE}", "--metadata", f"memrl.base={BASE}",
            "--metadata", "memrl.base_dtype=bfloat16", "--metadata", f"memrl.commit={commit}",
            "--metadata", "memrl.recipe=benchmarks/memagent_adapter_gpu.py --adapters "
            f"{spec} (distill_adapter.py on the warm start of real_model_gpu.py --plan adapter)",
            "configs/smollm2_memagent_sft.yaml", f"model.path={work / 'model'}",
            f"data.train_file={data['train_file']}", *plan.sft_overrides,
            gpu=i % plan.gpus if plan.gpus > 1 else None))
    runner.wait(*jobs)


def make_adapters(work: Path, out: Path, specs: list[str], commit: str) -> dict[str, Path]:
    """OUT/adapters/<spec>.safetensors for each adapter spec, and WORK/model_<spec> written
    from it as `init-model` writes the shipped agent. Returns the model directories."""
    import torch

    from memrl.models.adapters import extract_adapter, save_adapter
    from memrl.models.trained import write_adapted_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    base, tuned = weights_of(work / "model", device), weights_of(work / "model_warm", device)
    settings = (work / "model_warm" / "memrl_config.yaml").read_text(encoding="utf-8")
    models = {}
    for spec in specs:
        name = name_of(spec)
        model_dir = work / f"model_{name}"
        file = out / "adapters" / f"{name}.safetensors"
        if not (model_dir / "config.json").is_file():
            rank, sign = parse_adapter(spec)
            if parse_distilled(spec) is None:
                adapter = extract_adapter(base, tuned, rank, sign=sign, device=device)
                save_adapter(adapter, file, {
                    "memrl.title": TITLE, "memrl.base": BASE, "memrl.base_dtype": "bfloat16",
                    "memrl.recipe": "benchmarks/real_model_gpu.py --plan adapter "
                                    "--rows warm_start", "memrl.commit": commit})
            write_adapted_model(BASE, file, model_dir, settings=settings,
                                card=f"Measured by benchmarks/memagent_adapter_gpu.py, {spec}.")
            print(f"{spec}: {file.stat().st_size / 2**20:.2f} MiB, {model_dir}", flush=True)
        models[spec] = model_dir
    return models


def evaluate(plan, work: Path, res: Path, models: dict[str, Path], hotpotqa: Path | None
             ) -> None:
    """The warm start's evaluations of every adapted model, side by side over the plan's GPUs."""
    rows = tuple(row_of(spec) for spec in models)
    plan = dataclasses.replace(
        plan, bio=dataclasses.replace(plan.bio, rows=(*plan.bio.rows, *rows)),
        hqa=dataclasses.replace(plan.hqa, rows=(*plan.hqa.rows, *rows)),
        gpu_share={**plan.gpu_share, **dict.fromkeys(rows, "0.07")})
    runner = Runner(work)
    data = prepare_data(plan, runner, work / "data", hotpotqa)
    suites = {s.name: data[s.name] for s in (plan.bio, plan.hqa) if s.name in data}
    commands = [c for spec, model in models.items()
                for c in evaluations(plan, model, suites, res, row_of(spec))]
    runner.wait(*start_evaluations(runner, commands, plan.gpus), check=False)


def report(plan, res: Path, specs: list[str], tolerance: float, limit: int) -> dict:
    """Scores of the full model and each adapter at every evaluation; the smallest adapter
    (at most `limit` bytes) at most `tolerance` points under the full model everywhere (an
    adapter that scores above it keeps it too). The full model is the run's warm start: the
    fully fine-tuned model, or with a LoRA warm start the LoRA merged into its base."""
    protocol = trained_protocol(plan)
    table: dict[str, dict[str, float | None]] = {}
    for row in ("warm_start", *(row_of(s) for s in specs)):
        for suite in (plan.bio, plan.hqa):
            results = row_results(res, suite, row, protocol)
            for multiple, n in zip(suite.multiples, suite.eval_docs, strict=True):
                score = results.get(n, {}).get("score")
                table.setdefault(row, {})[f"{suite.name} {multiple}x"] = score
    full = table["warm_start"]
    sizes = {s: (res / "adapters" / f"{name_of(s)}.safetensors").stat().st_size for s in specs}
    within = [s for s in specs if sizes[s] <= limit and all(
        full[k] is not None and table[row_of(s)][k] is not None
        and table[row_of(s)][k] >= full[k] - tolerance for k in full)]
    result = {"protocol": protocol, "scores": table, "adapter_bytes": sizes,
              "tolerance_points": tolerance, "size_limit_bytes": limit,
              "smallest_within": min(within, key=sizes.get, default=None)}
    keys = list(full)
    lines = ["| model | size | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    row_sizes = {"warm_start": "-", **{row_of(s): f"{b / 1e6:.1f} MB" for s, b in sizes.items()}}
    for row, scores in table.items():
        cells = ["-" if scores[k] is None else f"{scores[k]:.1f}" for k in keys]
        lines.append(f"| {row} | {row_sizes[row]} | " + " | ".join(cells) + " |")
    (res / "adapter_report.json").write_text(json.dumps(result, indent=2) + "\n")
    (res / "adapter_report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), f"\nsmallest adapter at most {tolerance} points under the full "
          f"model and {limit} bytes: {result['smallest_within']}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--adapters", default="r16,sign,r2+sign",
                        help="adapters to extract and evaluate: rN (rank N), sign (one bit a "
                        "weight), rN+sign (rank N, then the signs of what it leaves), dN@LR "
                        "(rank N distilled on the warm start's logits at learning rate LR)")
    parser.add_argument("--distill-steps", type=int, default=None,
                        help="optimizer steps of each distilled adapter (default: the warm "
                        "start's)")
    parser.add_argument("--ranks", default=None, help="8,16,32: --adapters r8,r16,r32")
    parser.add_argument("--tolerance", type=float, default=2.0,
                        help="points an adapter may score under the full model (the run's "
                        "warm start: with --sft-override model.lora.enabled=true, the LoRA "
                        "merged) at every evaluation")
    parser.add_argument("--size-limit", type=int, default=20_000_000,
                        help="bytes an adapter may have (the issue's 20 MB)")
    parser.add_argument("--commit", default="unknown", help="memrl's commit (for the adapter)")
    parser.add_argument("--sft-override", action="append", default=[],
                        help="another override of the warm start's config (repeatable), e.g. "
                        "model.lora.enabled=true: the warm start trained as a LoRA")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs the evaluations are spread over (default: the plan's)")
    parser.add_argument("--hotpotqa", type=Path,
                        default=shared_data_file("hotpotqa", "dev_subsampled.jsonl"))
    args = parser.parse_args()
    adapters = args.adapters if args.ranks is None else ",".join(
        f"r{r}" for r in args.ranks.split(",") if r)
    specs = [s for s in adapters.split(",") if s]
    for spec in specs:
        parse_adapter(spec)
    plan = PLANS["adapter"]
    plan = dataclasses.replace(plan, sft_overrides=(*plan.sft_overrides, *args.sft_override),
                               gpus=args.gpus or plan.gpus)
    print_environment(environment())
    pipeline(plan, args.work, args.out, args.hotpotqa, rows=["warm_start"])
    distill(plan, args.work, args.out, specs, args.commit, args.hotpotqa, args.distill_steps)
    models = make_adapters(args.work, args.out, specs, args.commit)
    evaluate(plan, args.work, args.out, models, args.hotpotqa)
    report(plan, args.out, specs, args.tolerance, args.size_limit)


if __name__ == "__main__":
    main()

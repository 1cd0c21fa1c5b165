"""How small can the shipped SmolLM2 MemAgent be? Its warm start kept as a low-rank adapter.

`memrl init-model smollm2-135m-memagent` writes the published plan's warm start from an
adapter inside memrl (`memrl.models.trained`): the trained weights' difference from the base,
every matrix kept to rank r by a truncated SVD. This measures which r keeps the model's
scores, on one GPU host:

    1. real_model_gpu.py's `--plan adapter`, row warm_start: the base model (`memrl
       init-model smollm2-135m-instruct`), the data, the published-format corrective warm
       start (`memrl sft` + `memrl export`) and its evaluations: biographies 1x and 16x,
       RULER-HQA 1x, published protocol (`memrl eval`, a ruler-hqa entry with protocol memagent);
    2. for each rank: the adapter extracted from the warm start against the base model
       (`extract_low_rank`), the model directory `init-model` would write from it
       (`write_adapted_model`: the base de-quantized from its GGUF again, the adapter added),
       and the same evaluations of it, side by side;
    3. OUT/adapter_report.{json,md}: every rank's scores beside the full model's, the
       adapter's size, and the smallest rank within `--tolerance` points of the full model
       at every evaluation; the adapters in OUT/adapters/.

    python benchmarks/memagent_adapter_gpu.py --work /tmp/ad --out /tmp/ad/out --ranks 8,16,32
    python benchmarks/memagent_adapter_gpu.py --work /tmp/al --out /tmp/al/out --ranks 32 \
        --sft-override model.lora.enabled=true --sft-override model.lora.r=32 \
        --sft-override model.lora.alpha=64 --sft-override optim.lr=2e-4   # a LoRA warm start
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


def make_adapters(work: Path, out: Path, ranks: list[int], commit: str) -> dict[int, Path]:
    """OUT/adapters/r<rank>.safetensors for each rank, and WORK/model_r<rank> written from it
    as `init-model` writes the shipped agent. Returns the model directories."""
    import torch

    from memrl.models.adapters import extract_low_rank, save_adapter
    from memrl.models.trained import write_adapted_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    base, tuned = weights_of(work / "model", device), weights_of(work / "model_warm", device)
    settings = (work / "model_warm" / "memrl_config.yaml").read_text(encoding="utf-8")
    models = {}
    for rank in ranks:
        model_dir = work / f"model_r{rank}"
        if not (model_dir / "config.json").is_file():
            adapter = extract_low_rank(base, tuned, rank, device=device)
            file = save_adapter(adapter, out / "adapters" / f"r{rank}.safetensors", {
                "memrl.title": TITLE, "memrl.base": BASE, "memrl.base_dtype": "bfloat16",
                "memrl.recipe": "benchmarks/real_model_gpu.py --plan adapter --rows warm_start",
                "memrl.commit": commit})
            write_adapted_model(BASE, file, model_dir, settings=settings,
                                card=f"Measured by benchmarks/memagent_adapter_gpu.py, rank {rank}.")
            print(f"rank {rank}: {file.stat().st_size / 2**20:.2f} MiB, {model_dir}", flush=True)
        models[rank] = model_dir
    return models


def evaluate(plan, work: Path, res: Path, models: dict[int, Path], hotpotqa: Path | None
             ) -> None:
    """The warm start's evaluations of every adapted model, side by side over the plan's GPUs."""
    rows = tuple(f"adapter_r{r}" for r in models)
    plan = dataclasses.replace(
        plan, bio=dataclasses.replace(plan.bio, rows=(*plan.bio.rows, *rows)),
        hqa=dataclasses.replace(plan.hqa, rows=(*plan.hqa.rows, *rows)),
        gpu_share={**plan.gpu_share, **dict.fromkeys(rows, "0.07")})
    runner = Runner(work)
    data = prepare_data(plan, runner, work / "data", hotpotqa)
    suites = {s.name: data[s.name] for s in (plan.bio, plan.hqa) if s.name in data}
    commands = [c for rank, model in models.items()
                for c in evaluations(plan, model, suites, res, f"adapter_r{rank}")]
    runner.wait(*start_evaluations(runner, commands, plan.gpus), check=False)


def report(plan, res: Path, ranks: list[int], tolerance: float) -> dict:
    """Scores of the full model and each rank at every evaluation; the smallest rank within
    `tolerance` points of the full model everywhere."""
    protocol = trained_protocol(plan)
    table: dict[str, dict[str, float | None]] = {}
    for row in ("warm_start", *(f"adapter_r{r}" for r in ranks)):
        for suite in (plan.bio, plan.hqa):
            results = row_results(res, suite, row, protocol)
            for multiple, n in zip(suite.multiples, suite.eval_docs, strict=True):
                score = results.get(n, {}).get("score")
                table.setdefault(row, {})[f"{suite.name} {multiple}x"] = score
    full = table["warm_start"]
    sizes = {r: (res / "adapters" / f"r{r}.safetensors").stat().st_size for r in ranks}
    within = [r for r in ranks if all(
        full[k] is not None and table[f"adapter_r{r}"][k] is not None
        and abs(table[f"adapter_r{r}"][k] - full[k]) <= tolerance for k in full)]
    result = {"protocol": protocol, "scores": table, "adapter_bytes": sizes,
              "tolerance_points": tolerance, "smallest_rank_within": min(within, default=None)}
    keys = list(full)
    lines = ["| model | size | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    row_sizes = {"warm_start": "-", **{f"adapter_r{r}": f"{b / 2**20:.1f} MiB"
                                       for r, b in sizes.items()}}
    for row, scores in table.items():
        size = row_sizes[row]
        cells = ["-" if scores[k] is None else f"{scores[k]:.1f}" for k in keys]
        lines.append(f"| {row} | {size} | " + " | ".join(cells) + " |")
    (res / "adapter_report.json").write_text(json.dumps(result, indent=2) + "\n")
    (res / "adapter_report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), f"\nsmallest rank within {tolerance} points: "
          f"{result['smallest_rank_within']}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ranks", default="8,16,32")
    parser.add_argument("--tolerance", type=float, default=2.0)
    parser.add_argument("--commit", default="unknown", help="memrl's commit (for the adapter)")
    parser.add_argument("--sft-override", action="append", default=[],
                        help="another override of the warm start's config (repeatable), e.g. "
                        "model.lora.enabled=true: the warm start trained as a LoRA")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs the evaluations are spread over (default: the plan's)")
    parser.add_argument("--hotpotqa", type=Path,
                        default=shared_data_file("hotpotqa", "dev_subsampled.jsonl"))
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",") if r]
    plan = PLANS["adapter"]
    plan = dataclasses.replace(plan, sft_overrides=(*plan.sft_overrides, *args.sft_override),
                               gpus=args.gpus or plan.gpus)
    print_environment(environment())
    pipeline(plan, args.work, args.out, args.hotpotqa, rows=["warm_start"])
    models = make_adapters(args.work, args.out, ranks, args.commit)
    evaluate(plan, args.work, args.out, models, args.hotpotqa)
    report(plan, args.out, ranks, args.tolerance)


if __name__ == "__main__":
    main()

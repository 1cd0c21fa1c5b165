"""The quickstart: a model built by memrl learns the real task, and you watch it.

    1. a tiny Qwen2 (random weights) + one-fact synthetic questions; training questions and
       evaluation questions are about disjoint sets of invented people and places, so an
       answer can only be read from the document
    2. evaluate the untrained model at several document counts (RULER-style, sub-EM)
    3. warm start: `memrl sft` on the oracle's trajectories         → evaluate
    4. GRPO with the real answer reward (`rl.reward`, sub-EM/EM)    → evaluate
    5. the accuracy table (before / warm start / RL × document count) and its plot

Everything runs offline on a CPU with the same code as a real run: data builders, MemAgent,
the HF engine, both recipes, checkpoints, export and `memrl eval`'s evaluation.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.config import load_config
from memrl.errors import MemrlInputError
from memrl.recipes.config import TrainConfig

MODEL_SHAPE: dict[str, Any] = {
    "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
    "intermediate_size": 256, "vocab_size": 1024, "initializer_range": 0.02,
}
"""The tiny model memrl builds (about 0.4M parameters). Initialised as Hugging Face does
(0.02): the test models' 0.2 (`build_tiny_model`'s default, which makes an untrained model's
output depend on its prompt) learns this task far slower from scratch (measured: 16.7 vs
31.2 sub-EM after the same 1,500 constant-lr warm-start steps on 32-token chunks,
docs/lab/results.md)."""
BUILT_MANIFEST = ".quickstart_built.json"
"""In the run's directory: what `prepare_quickstart` built (model, questions, evaluation
sets), which `run_quickstart(fresh=True)` deletes so that it is built again."""
STAGES = ("before", "warm_start", "rl")


@dataclass(frozen=True)
class QuickstartPlan:
    """What the quickstart builds and how it evaluates; the defaults are the 2-core CPU
    quickstart, `benchmarks/miniature.py` passes a GPU-sized one."""

    train_docs: int = 4
    """Documents per training question (the "training length")."""
    eval_docs: tuple[int, ...] = (4, 8, 16, 32)
    """Documents per evaluation question: 1x, 2x, 4x and 8x the training length."""
    eval_questions: int = 128
    """Evaluation questions per document count."""
    train_questions: int = 4000
    """Training questions (the oracle answers each once for the warm start; GRPO samples
    them). Many distinct people, so the model learns to read, not to remember."""
    model_shape: dict[str, Any] = field(default_factory=lambda: dict(MODEL_SHAPE))
    """`build_tiny_model` arguments of the model memrl builds."""
    device: str = "cpu"
    """Where the evaluations run."""
    eval_batch_size: int = 64
    """Episodes per lockstep generate call in the evaluations."""
    evaluate_before: bool = True
    """Evaluate the untrained model too (it scores 0; at long documents it is the slowest
    evaluation, since it never stops before max_memory_tokens)."""
    threads: int | None = 1
    """torch's CPU threads in this process (`torch.set_num_threads`); None: torch's default
    (one per core). One suits the tiny model, whose matrices are too small to share among
    threads, on a CPU shared with other work (docs/lab/benchmarks.md, the quickstart's
    threads)."""


def prepare_quickstart(cfg: TrainConfig, *, seed: int = 0,
                       plan: QuickstartPlan = QuickstartPlan()) -> Path:
    """Build the tiny model, the training / validation questions and the RULER-style
    evaluation sets that the config points at; existing files are kept. Returns the
    evaluation directory."""
    from memrl.data.hotpotqa import save_records_jsonl
    from memrl.data.ruler_hqa import write_ruler_hqa
    from memrl.data.synthetic import make_synthetic_records
    from memrl.eval.report import write_json
    from memrl.models.tiny import build_tiny_model

    train = make_synthetic_records(plan.train_questions, plan.train_docs, seed, hops=1,
                                   entities="train")
    model_dir = Path(cfg.model.path)
    built: list[Path] = []
    if not (model_dir / "config.json").exists():
        # The tokenizer learns the prompts' words and the names' syllables.
        prompts = cfg.memagent.resolved_prompts
        corpus = [
            prompts.update_text(prompt=r.question, memory=prompts.no_memory,
                                chunk=r.render_context())
            + prompts.final_text(prompt=r.question, memory=r.documents[0].text)
            + f" \\boxed{{{r.answers[0]}}}"
            for r in train[:300]
        ]
        build_tiny_model(model_dir, seed=seed, corpus=corpus, **plan.model_shape)
        built.append(model_dir)
    if not Path(cfg.data.train_file).exists():
        save_records_jsonl(train, cfg.data.train_file)
        built.append(Path(cfg.data.train_file))
    if cfg.data.val_file and not Path(cfg.data.val_file).exists():
        val = make_synthetic_records(16, plan.train_docs, seed + 1, hops=1, entities="eval")
        save_records_jsonl(val, cfg.data.val_file)
        built.append(Path(cfg.data.val_file))
    eval_dir = Path(cfg.trainer.out_dir).parent / "eval_data"
    if not all((eval_dir / f"eval_{n}.json").exists() for n in plan.eval_docs):
        # One gold paragraph per question; distractors are other questions' paragraphs.
        pool = make_synthetic_records(max(plan.eval_questions, max(plan.eval_docs)) + 16, 1,
                                      seed + 2, hops=1, entities="eval")
        write_ruler_hqa(pool, eval_dir, list(plan.eval_docs), seed=seed,
                        num_questions=plan.eval_questions)
        built.append(eval_dir)
    if built:
        manifest = eval_dir.parent / BUILT_MANIFEST
        known = json.loads(manifest.read_text()) if manifest.exists() else []
        write_json(manifest, sorted({*known, *(str(p) for p in built)}))
    return eval_dir


def remove_built(root: Path) -> list[Path]:
    """Delete what `prepare_quickstart` built for the run in `root` (its manifest lists it),
    so that the next run builds it again from this code; a model or file the quickstart did
    not build is never touched. Returns what was deleted."""
    manifest = root / BUILT_MANIFEST
    if not manifest.exists():
        return []
    built = [Path(p) for p in json.loads(manifest.read_text())]
    for path in built:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    manifest.unlink()
    return built


def evaluate(model_dir: Path, eval_dir: Path, out_dir: Path, cfg: TrainConfig,
             console: Any, plan: QuickstartPlan = QuickstartPlan()) -> dict[str, Any]:
    """Greedy MemAgent evaluation of a saved model at every `plan.eval_docs` (results.json
    etc.)."""
    from memrl.eval.ruler_hqa import evaluate_ruler_hqa
    from memrl.inference.hf import HFEngine
    from memrl.inference.loader import load_pretrained

    generator = HFEngine(*load_pretrained(model_dir, device=plan.device),
                         generation_batch_size=plan.eval_batch_size)
    agent_cfg = cfg.memagent.model_copy(  # greedy; the training config's top_p, as before
        update={"seed": cfg.seed, "temperature": 0.0, "top_p": cfg.rollout.top_p})
    return evaluate_ruler_hqa(generator, eval_dir, list(plan.eval_docs), config=agent_cfg,
                              out_dir=out_dir, model_name=str(model_dir), console=console)


def train_and_export(train: Any, run_dir: Path, model_dir: Path, console: Any) -> None:
    """One training stage: nothing when `model_dir` exists (the stage finished: its export
    is renamed into place only when complete); else `train()` (which resumes from the
    stage's latest checkpoint, `trainer.resume=auto`) and the export of its last checkpoint."""
    from memrl.run.checkpoint import export_checkpoint, latest_checkpoint

    if model_dir.is_dir():
        console.print(f"done before: {model_dir}")
        return
    train()
    partial = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    export_checkpoint(latest_checkpoint(run_dir / "checkpoints"), partial)
    partial.rename(model_dir)


def accuracy_table(results: dict[str, dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Sub-EM (%) of each stage at each document count, from the stages' results.json."""
    return {
        stage: {int(n): 100.0 * r["sub_em"] for n, r in res["results"].items()}
        for stage, res in results.items()
    }


def report(results: dict[str, dict[str, Any]], plan: QuickstartPlan, root: Path, *,
           runs: dict[str, Path], console: Any) -> dict[str, Any]:
    """The accuracy table of the stages evaluated (printed), its plot and `summary.json`
    (`runs`: the training runs' directories, by name); returns the summary."""
    from rich.table import Table

    from memrl.eval.report import plot_scores, write_json

    table = accuracy_table(results)
    view = Table("stage", *(f"N={n}" for n in plan.eval_docs))
    stages = [s for s in STAGES if s in results]
    for stage in stages:
        view.add_row(stage, *(f"{table[stage][n]:.1f}" for n in plan.eval_docs))
    console.print(view)
    tokens = [results["rl"]["results"][str(n)]["context_tokens"] for n in plan.eval_docs]
    plot = plot_scores(root / "accuracy.png", tokens,
                       {s: [table[s][n] for n in plan.eval_docs] for s in stages},
                       xlabel="mean context length (tokens)", ylabel="sub-EM (%)",
                       title="quickstart: before / warm start / RL",
                       labels=[f"N={n}" for n in plan.eval_docs])
    summary = {
        "table": {s: {str(n): v for n, v in row.items()} for s, row in table.items()},
        "train_docs": plan.train_docs, "eval_docs": list(plan.eval_docs), "plot": str(plot),
        **{name: str(path) for name, path in runs.items()},
        "evaluations": {s: str(root / f"eval_{s}") for s in stages},
    }
    write_json(root / "summary.json", summary)
    console.print(f"plot {plot}; summary {root / 'summary.json'}; "
                  f"browse the episodes: memrl view {root / 'eval_rl'}")
    return summary


def run_quickstart(
    config_path: str | Path,
    overrides: list[str] = (),
    *,
    sft_config_path: str | Path = "configs/quickstart_sft.yaml",
    sft_overrides: list[str] = (),
    fresh: bool = False,
    console: Any = None,
    plan: QuickstartPlan = QuickstartPlan(),
) -> dict[str, Any]:
    """Prepare, evaluate, warm-start, evaluate, train with GRPO, evaluate; print and plot
    the accuracy table. Returns where everything went and the table."""
    from rich.console import Console
    from memrl.recipes import grpo, sft
    from memrl.recipes.sft_config import SFTConfig
    from memrl.run.record import recorded

    console = console or Console()
    if plan.threads is not None:
        import torch

        torch.set_num_threads(plan.threads)
    cfg = load_config(TrainConfig, config_path, [*overrides, "trainer.resume=auto"])
    if cfg.rl.reward not in ("sub_em", "em"):
        raise MemrlInputError("the quickstart trains on the answer itself: use sub_em or em",
                              location="rl.reward")
    out = Path(cfg.trainer.out_dir)
    root = out.parent
    warm_run, warm_model, rl_model = root / "sft", root / "model_warm", root / "model_rl"
    base_model = Path(cfg.model.path)
    runs = [out, warm_run, warm_model, rl_model, *(root / f"eval_{s}" for s in STAGES)]
    if fresh:
        remove_built(root)
        for d in runs:
            shutil.rmtree(d, ignore_errors=True)
    elif any(d.exists() for d in runs):
        console.print(f"continuing the quickstart in {root} where it stopped "
                      "(--fresh starts over)")
    sft_cfg = load_config(SFTConfig, sft_config_path, [
        f"model.path={base_model}", f"data.train_file={cfg.data.train_file}",
        f"trainer.out_dir={warm_run}", f"seed={cfg.seed}", "trainer.resume=auto",
        *sft_overrides,
    ]).model_copy(update={"agent_config": cfg.agent_config})

    settings = {"train": cfg.model_dump(mode="json"), "sft": sft_cfg.model_dump(mode="json")}
    with recorded(root, "quickstart", config=settings, seed=cfg.seed,
                  engine=cfg.rollout.engine, device=cfg.model.device):
        console.rule("1/5 tiny model and synthetic data (train / eval entities disjoint)")
        eval_dir = prepare_quickstart(cfg, seed=cfg.seed, plan=plan)
        console.print(f"model {base_model}, training questions {cfg.data.train_file}, "
                      f"evaluation sets {eval_dir} "
                      f"(N = {', '.join(map(str, plan.eval_docs))} documents)")
        results: dict[str, dict[str, Any]] = {}

        console.rule("2/5 evaluation of the untrained model")
        if plan.evaluate_before:
            results["before"] = evaluate(base_model, eval_dir, root / "eval_before", cfg, console,
                                         plan)
        else:
            console.print("skipped (QuickstartPlan.evaluate_before is false)")

        console.rule("3/5 warm start: supervised fine-tuning on the oracle's trajectories")
        train_and_export(lambda: sft.train(sft_cfg, console=console), warm_run, warm_model,
                         console)
        results["warm_start"] = evaluate(warm_model, eval_dir, root / "eval_warm_start", cfg,
                                         console, plan)

        console.rule(f"4/5 GRPO from the warm start, reward {cfg.rl.reward}")
        rl_cfg = cfg.model_copy(update={"model": cfg.model.model_copy(
            update={"path": str(warm_model)})})
        train_and_export(lambda: grpo.train(rl_cfg, console=console), out, rl_model, console)
        results["rl"] = evaluate(rl_model, eval_dir, root / "eval_rl", cfg, console, plan)

        console.rule("5/5 accuracy (sub-EM %) against the number of documents")
        return report(results, plan, root, runs={"warm_start_run": warm_run, "rl_run": out},
                      console=console)

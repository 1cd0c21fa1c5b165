"""The quickstart: tiny model + synthetic data → RULER-style eval → GRPO training → eval.

Everything runs offline on a laptop CPU in a minute or two, and exercises the same code paths
as a real run: data builders, the MemAgent agent, the HF generator, the trainer, checkpoints,
export and the evaluation reports.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from memrl.config import load_config
from memrl.errors import MemrlInputError
from memrl.recipes.config import TrainConfig

RULER_NUM_DOCS = (2, 4, 8)
"""RULER-style context sizes for the quickstart evaluation (documents per question)."""


def prepare_quickstart(cfg: TrainConfig, *, seed: int = 0) -> Path:
    """Build the tiny model, train/val data and RULER-style eval sets the config points at.

    Existing files are kept, so a second run reuses them. Returns the RULER-HQA directory.
    """
    from memrl.data.hotpotqa import save_records_jsonl
    from memrl.data.ruler_hqa import write_ruler_hqa
    from memrl.data.synthetic import make_synthetic_records, synthetic_corpus
    from memrl.models.tiny import build_tiny_model

    model_dir = Path(cfg.model.path)
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, seed=seed, corpus=synthetic_corpus(seed, 200))
    train = Path(cfg.data.train_file)
    if not train.exists():
        save_records_jsonl(make_synthetic_records(64, num_docs=2, seed=seed), train)
    if cfg.data.val_file and not Path(cfg.data.val_file).exists():
        save_records_jsonl(make_synthetic_records(8, num_docs=2, seed=seed + 1), cfg.data.val_file)
    ruler_dir = Path(cfg.trainer.out_dir).parent / "ruler"
    if not all((ruler_dir / f"eval_{n}.json").exists() for n in RULER_NUM_DOCS):
        pool = make_synthetic_records(32, num_docs=2, seed=seed + 2)
        write_ruler_hqa(pool, ruler_dir, list(RULER_NUM_DOCS), seed=seed)
    return ruler_dir


def _evaluate(model_dir: Path, ruler_dir: Path, out_dir: Path, cfg: TrainConfig, console) -> dict:
    from memrl.eval.ruler_hqa import evaluate_ruler_hqa
    from memrl.inference.hf import HFGenerator
    from memrl.inference.loader import load_pretrained

    generator = HFGenerator(*load_pretrained(model_dir, device="cpu"))
    agent_cfg = cfg.memagent.model_copy(update={"seed": cfg.seed})
    return evaluate_ruler_hqa(
        generator,
        ruler_dir,
        list(RULER_NUM_DOCS),
        config=agent_cfg,
        out_dir=out_dir,
        limit=8,
        model_name=str(model_dir),
        console=console,
    )


def run_quickstart(
    config_path: str | Path,
    overrides: list[str] = (),
    *,
    fresh: bool = False,
    console: Any = None,
) -> dict[str, Any]:
    """Prepare, evaluate, train, export, evaluate again; returns where everything went."""
    from rich.console import Console

    from memrl.recipes import grpo
    from memrl.rl.checkpoint import export_checkpoint, latest_checkpoint

    console = console or Console()
    cfg = load_config(TrainConfig, config_path, list(overrides))
    out = Path(cfg.trainer.out_dir)
    root = out.parent
    runs = [out, root / "eval_before", root / "eval_after", root / "model_trained"]
    if fresh:
        for d in runs:
            shutil.rmtree(d, ignore_errors=True)
    elif latest_checkpoint(out / "checkpoints") is not None:
        raise MemrlInputError(
            f"{out} already holds a training run: pass --fresh to start over", location=str(out)
        )

    console.rule("1/4 tiny model and synthetic data")
    ruler_dir = prepare_quickstart(cfg, seed=cfg.seed)
    console.print(f"model {cfg.model.path}, data {cfg.data.train_file}, RULER-style {ruler_dir}")

    console.rule("2/4 MemAgent evaluation before training")
    before = _evaluate(Path(cfg.model.path), ruler_dir, root / "eval_before", cfg, console)

    console.rule("3/4 GRPO training")
    grpo.train(cfg, console=console)
    export_dir = root / "model_trained"
    shutil.rmtree(export_dir, ignore_errors=True)
    export_checkpoint(latest_checkpoint(out / "checkpoints"), export_dir)

    console.rule("4/4 MemAgent evaluation after training")
    after = _evaluate(export_dir, ruler_dir, root / "eval_after", cfg, console)
    summary = {
        "model": cfg.model.path,
        "train_run": str(out),
        "training_plot": str(out / "training.png"),
        "metrics": str(out / "metrics.jsonl"),
        "trained_model": str(export_dir),
        "eval_before": str(root / "eval_before"),
        "eval_after": str(root / "eval_after"),
        "before": before,
        "after": after,
    }
    console.rule("done")
    for key in ("training_plot", "metrics", "trained_model", "eval_before", "eval_after"):
        console.print(f"{key:>14}: {summary[key]}")
    return summary

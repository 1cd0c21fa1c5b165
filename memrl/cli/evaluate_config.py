"""`memrl eval CONFIG [key.path=value ...] [--resume]`: an evaluation config
(`memrl.recipes.evaluate.EvalConfig`) run by the one evaluation runner."""

from __future__ import annotations

from pathlib import Path

import typer

from memrl.cli import common
from memrl.cli.app import CONFIG_COMMAND, eval_app


@eval_app.command(CONFIG_COMMAND, hidden=True)
def eval_config(
    config: Path = typer.Argument(..., help="Evaluation config (YAML)."),
    overrides: list[str] = typer.Argument(
        None, help="Dotted overrides, e.g. rollout.engine=vllm eval.limit=10"),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in eval.out_dir (finished episodes are kept; "
        "re-running into the same eval.out_dir resumes anyway)."),
) -> None:
    """Run an evaluation config: its agent on its benchmarks (a run directory per
    benchmark, leaderboard.md / .json across them in eval.out_dir)."""
    from memrl.config import load_config
    from memrl.errors import MemrlInputError
    from memrl.modelfiles import check_model_dir, check_tokenizer_dir
    from memrl.recipes.evaluate import EvalConfig, eval_seed, evaluate, sampling_as_rollout

    cfg = sampling_as_rollout(load_config(EvalConfig, config, list(overrides or [])))
    out = Path(cfg.eval.out_dir)
    model = Path(cfg.model.path)
    if not model.is_dir():
        raise MemrlInputError("model directory not found", location=f"model.path {model}")
    check_model_dir(model)
    check_tokenizer_dir(model)
    common.check_out_dir(out)
    serving = common.EngineChoice(engine=cfg.rollout.engine, device=cfg.model.device,
                                  dtype=cfg.model.dtype)
    with common.evaluation_ranks(serving) as dist, \
            common.record_eval(out, "eval", engine=cfg.rollout.engine, device=cfg.model.device,
                               seed=eval_seed(cfg), settings=cfg.model_dump(mode="json")), \
            common.eval_interruptible(out):
        evaluate(cfg, resume=resume, dist=dist, show_progress=True)
    if dist.is_main:
        typer.echo(f"results written to {out}")

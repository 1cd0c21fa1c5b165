"""`memrl eval [CONFIG] [key.path=value ...] [--resume]`: an agent on benchmarks (or on its
own records) without learning, described by one typed config
(`memrl.recipes.evaluate.EvalConfig`) and run by the one evaluation runner."""

from __future__ import annotations

from pathlib import Path

import typer

from memrl.cli import common
from memrl.cli.app import app

KEYS_HELP = (
    "Keys (docs/configuration.md, `memrl eval`): agent (memagent, memupdate, long-context, "
    "or package.module:Class) and its section (memagent.chunk_size=..., "
    "long_context.window=...); model.path, model.dtype, model.device, model.threads; "
    "rollout.engine (hf, vllm, openai), rollout.n, rollout.temperature, rollout.top_p, "
    "rollout.generation_batch_size, rollout.openai.base_urls, rollout.openai.timeout_s, "
    "rollout.vllm.*; rl.reward; seed; eval.benchmarks (a list of NAME=DIR or {name, "
    "data_dir, num_docs, pool, protocol, categories, split, judge_model}), eval.data, "
    "eval.data_format, eval.num_docs, eval.out_dir, eval.limit, eval.records_per_run, "
    "eval.data_parallel, eval.progress.")


@app.command("eval", help=(
    "Evaluate a model with a memory agent (no learning): its agent on every benchmark of "
    "eval.benchmarks (a run directory each with results.json, results.md, trajectories and "
    "plot, and leaderboard.md / .json across them in eval.out_dir), or on its own records "
    "(eval.data). Example: memrl eval agent=memagent model.path=runs/x/hf "
    "eval.benchmarks=\\[ruler-hqa=data/hqa] eval.num_docs=\\[50,100]. " + KEYS_HELP))
def evaluate(
    args: list[str] = typer.Argument(
        None, help="\\[CONFIG.yaml] \\[key.path=value ...], e.g. "
        "rollout.engine=vllm eval.limit=10 'eval.benchmarks=\\[ruler-hqa=data/hqa]'."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in eval.out_dir (an error if there is none; "
        "re-running into the same eval.out_dir resumes anyway)."),
) -> None:
    from memrl.config import load_command_config
    from memrl.errors import MemrlInputError
    from memrl.fileio import check_output_dir
    from memrl.modelfiles import check_model_dir, check_tokenizer_dir
    from memrl.recipes.evaluate import (
        EvalConfig,
        benchmarks_of,
        eval_seed,
        evaluate,
        load_engine,
        sampling_as_rollout,
    )

    cfg = sampling_as_rollout(load_command_config(EvalConfig, args))
    out = Path(cfg.eval.out_dir)
    model = Path(cfg.model.path)
    if not model.is_dir():
        raise MemrlInputError("model directory not found", location=f"model.path {model}")
    check_model_dir(model)  # its files, each error located at the file
    check_tokenizer_dir(model)
    check_output_dir(out, location=f"eval.out_dir {out}")
    benches = None if cfg.eval.data is not None else benchmarks_of(cfg)  # files checked first
    if resume and not (out / "results.json").is_file() and not any(out.glob("*/results.json")):
        raise MemrlInputError("nothing to resume: no results.json here",
                              location=f"eval.out_dir {out}")
    serving = common.EngineChoice(engine=cfg.rollout.engine, device=cfg.model.device,
                                  dtype=cfg.model.dtype, data_parallel=cfg.eval.data_parallel)
    with common.evaluation_ranks(serving) as dist, \
            common.record_eval(out, "eval", engine=cfg.rollout.engine, device=cfg.model.device,
                               seed=eval_seed(cfg), settings=cfg.model_dump(mode="json")), \
            common.eval_interruptible(out):
        engine = serving.keep(load_engine(cfg))  # closed after the ranks' last barrier
        evaluate(cfg, resume=resume, dist=dist, show_progress=cfg.eval.progress,
                 engine=engine, benches=benches)
    if dist.is_main:
        typer.echo(f"results written to {out}")

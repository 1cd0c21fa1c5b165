"""`memrl eval agent --agent NAME`: any task (a registered agent, the long-context reader or
a plug-in's import path) on its own data, or on benchmarks (`--benchmark NAME=DIR ...`:
a suite, one run directory a benchmark and a leaderboard), through the one evaluation
runner (no learning)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.cli.app import eval_app
from memrl.cli import common
from memrl.errors import MemrlInputError
from memrl.recipes.evaluate import eval_seed, sampling_as_rollout


@eval_app.command("agent")
@common.engine_options([*common.LOCAL, *common.POOL, *common.VLLM, *common.DATA_PARALLEL])
def agent(
    agent: Annotated[str | None, typer.Option(
        "--agent", help="memagent, memupdate, long-context (the whole document in one "
        "prompt), or a Task class by import path package.module:Class (default: the "
        "--config's agent).")] = None,
    model: common.ModelOption = ...,
    data: Annotated[str | None, typer.Option(
        "--data", help="Records the task's `load` reads (not with --benchmark).")] = None,
    benchmarks: Annotated[list[str] | None, typer.Option(
        "--benchmark", help="NAME=DIR: a benchmark (ruler-hqa, biographies, where-now, "
        "where-before, who-has, counting, knowledge-update, or package.module:attr) and its "
        "eval_{N}.json directory; several make a suite with a leaderboard.")] = None,
    num_docs: Annotated[list[int] | None, typer.Option(
        "--num-docs", help="The N to run of every --benchmark (default: all its files).")
    ] = None,
    out: common.OutOption = ...,
    serving: common.EngineChoice = None,  # type: ignore[assignment]  (the common.engine_options)
    config: Annotated[Path | None, typer.Option(
        "--config", help="A training config (YAML): its agent section and reward are used; "
        "its model and data are replaced by --model and --data.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="A dotted override of the config, as for `memrl train`, e.g. "
        "--set rollout.temperature=0; repeat for several.")] = None,
    data_format: Annotated[str, typer.Option("--format", help="data.format of the task's "
                                             "loader.")] = "auto",
    limit: Annotated[int | None, typer.Option(min=1, help="The first K records.")] = None,
    num_samples: Annotated[int, typer.Option(
        "--n", min=1, help="Trajectories per record (as rollout.n in training).")] = 1,
    episodes_per_run: Annotated[int, typer.Option(
        min=1, help="Records rolled out and saved together (a kill loses at most these).")] = 32,
    resume: common.ResumeEvalOption = False,
    quiet: Annotated[bool, typer.Option(help="Hide the progress bar.")] = False,
) -> None:
    """Roll out any task on its records (--data; results.json with the mean reward and
    scores, results.md, trajectories.jsonl), or on benchmarks x lengths (--benchmark
    NAME=DIR ... --num-docs ...; a run directory per benchmark with its table and plot, and
    leaderboard.md / .json across them: docs/protocols.md)."""
    from memrl.config import load_config
    from memrl.eval.benchmark import AGENTS
    from memrl.eval.report import run_header
    from memrl.eval.runner import evaluate_task
    from memrl.recipes.config import TrainConfig
    from memrl.tasks import build_task

    common.check_model_dir(model)
    common.check_out_dir(out)
    if (data is None) == (not benchmarks):
        raise MemrlInputError("give one of --data (the task's records) and --benchmark "
                              "NAME=DIR", location="--data")
    name, agent = agent, AGENTS.get(agent, agent) if agent else agent
    # with --benchmark the task's own loader reads nothing: data.train_file only fills the slot
    sets = [f"model.path={model}", f"data.train_file={data or model}",
            f"data.format={data_format}", *([f"agent={agent}"] if agent else []),
            *(overrides or [])]
    cfg = sampling_as_rollout(load_config(TrainConfig, config, sets))
    task = build_task(cfg)
    if benchmarks:
        return suite(task, cfg, serving, benchmarks, num_docs, name or cfg.agent, model=model,
                     out=out, limit=limit, num_samples=num_samples,
                     per_run=episodes_per_run, resume=resume, quiet=quiet)
    records = task.load(data, data_format, what="evaluation")[:limit]
    seed = eval_seed(cfg)
    settings = {"model": str(model), "data": data, "limit": limit, "samples": num_samples,
                "engine": serving.engine, "dtype": serving.dtype, "agent": cfg.agent,
                "config": cfg.agent_config.model_dump(mode="json"), "reward": cfg.rl.reward}
    with common.evaluation_ranks(serving) as dist, \
            common.record_eval(out, "eval agent", engine=serving.engine,
                               device=serving.device, seed=seed, settings=settings), \
            common.eval_interruptible(out):
        generator = serving.load(model, seed=seed)
        header = run_header(f"agent {cfg.agent}", generator, str(model), cfg.agent_config,
                            protocol=f"reward {cfg.rl.reward or task.rewards[0]}", agent=cfg.agent,
                            data=data, limit=limit, num_samples=num_samples)
        evaluate_task(task, generator, records, out_dir=out, header=header, num_samples=num_samples,
                      per_run=episodes_per_run, seed=seed, resume=resume,
                      show_progress=not quiet, dist=dist)
    if dist.is_main:
        typer.echo(f"results written to {out}")


def parse_benchmarks(specs: list[str], num_docs: list[int] | None,
                     limit: int | None) -> dict[str, Any]:
    """`--benchmark NAME=DIR ...` -> {name: Benchmark} (`memrl.eval.benchmark.benchmark_of`),
    every file checked before a model is loaded."""
    from memrl.eval.benchmark import benchmark_of

    benches: dict[str, Any] = {}
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep or not name or not directory:
            raise MemrlInputError(f"{spec!r} is not NAME=DIR (e.g. where-now=data/where-now)",
                                  location="--benchmark")
        if name in benches:
            raise MemrlInputError(f"{name} given twice", location="--benchmark")
        benches[name] = benchmark_of(name, directory, num_docs, limit)
    return benches


def suite(task: Any, cfg: Any, serving: Any, specs: list[str], num_docs: list[int] | None,
          agent: str, *, model: Path, out: Path, limit: int | None, num_samples: int, per_run: int,
          resume: bool, quiet: bool) -> None:
    """`memrl eval agent --benchmark ...`: the task on every benchmark and the leaderboard
    (`memrl.eval.benchmark.evaluate_suite`); `agent` as the user named it."""
    from memrl.eval.benchmark import evaluate_suite
    from memrl.eval.report import run_header

    benches = parse_benchmarks(specs, num_docs, limit)
    seed = eval_seed(cfg)
    settings = {"model": str(model), "benchmarks": specs, "num_docs": num_docs,
                "limit": limit, "samples": num_samples, "engine": serving.engine,
                "dtype": serving.dtype, "agent": agent,
                "config": cfg.agent_config.model_dump(mode="json")}
    with common.evaluation_ranks(serving) as dist, \
            common.record_eval(out, "eval agent", engine=serving.engine,
                               device=serving.device, seed=seed, settings=settings), \
            common.eval_interruptible(out):
        generator = serving.load(model, seed=seed)
        evaluate_suite(task, generator, benches, out_dir=out, seed=seed, dist=dist,
                       header=lambda b: run_header(
                           b.name, generator, str(model), cfg.agent_config, agent=agent,
                           protocol=f"benchmark {b.name}", metric=b.metric,
                           data_dir=str(getattr(b, "data_dir", "")),
                           num_docs=b.slices(), limit=limit, num_samples=num_samples,
                           records_per_run=per_run),
                       num_samples=num_samples, per_run=per_run, resume=resume,
                       show_progress=not quiet)
    if dist.is_main:
        typer.echo(f"results written to {out}")

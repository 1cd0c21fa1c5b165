"""`memrl eval agent --agent NAME`: any task (a registered agent or a plug-in's import path)
on its own data, through the one evaluation runner (no learning)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.cli.app import eval_app
from memrl.cli import common


@eval_app.command("agent")
@common.engine_options([*common.LOCAL, *common.POOL, *common.VLLM, *common.DATA_PARALLEL])
def agent(
    agent: Annotated[str | None, typer.Option(
        "--agent", help="memagent, memupdate, or a Task class by import path "
        "package.module:Class (default: the --config's agent).")] = None,
    model: common.ModelOption = ...,
    data: Annotated[str, typer.Option("--data", help="Records the task's `load` reads.")] = ...,
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
    """Roll out any task on its records; write results.json (mean reward and scores),
    results.md and trajectories.jsonl."""
    from memrl.config import load_config
    from memrl.eval.report import run_header
    from memrl.eval.runner import evaluate_task
    from memrl.recipes.config import TrainConfig
    from memrl.tasks import build_task

    common.check_model_dir(model)
    common.check_out_dir(out)
    sets = [f"model.path={model}", f"data.train_file={data}", f"data.format={data_format}",
            *([f"agent={agent}"] if agent else []), *(overrides or [])]
    cfg = sampling_as_rollout(load_config(TrainConfig, config, sets))
    task = build_task(cfg)
    records = task.load(data, data_format, what="evaluation")[:limit]
    seed = cfg.agent_config.seed if getattr(cfg.agent_config, "seed", None) is not None \
        else cfg.seed
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


def sampling_as_rollout(cfg: Any) -> Any:
    """`cfg` whose agent section samples as its `rollout` says where the config (or a `--set`)
    gives `rollout.temperature` / `rollout.top_p`: the evaluation then samples as training
    did. Otherwise the agent section's own sampling (its defaults) is kept."""
    section = cfg.agent_config
    given = {key: getattr(cfg.rollout, key) for key in ("temperature", "top_p")
             if key in cfg.rollout.model_fields_set and key in type(section).model_fields}
    if not given:
        return cfg
    return cfg.model_copy(update={"agent_config": section.model_copy(update=given)})

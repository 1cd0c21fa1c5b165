"""`memrl eval ...`: evaluate a model with a memory agent (no learning)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memrl.agents.memagent import MemAgentConfig
from memrl.cli.app import eval_app
from memrl.cli import common
from memrl.errors import MemrlInputError
from memrl.eval.ruler_hqa import DEFAULT_RECORDS_PER_RUN
from memrl.tasks.memagent_qa import PROTOCOLS


@eval_app.command("ruler-hqa")
@common.engine_options([*common.LOCAL, *common.POOL, *common.VLLM, *common.DATA_PARALLEL])
@common.config_options(
    MemAgentConfig,
    ["chunk_size", "max_chunks", "max_memory_tokens", "max_final_tokens", "temperature",
     "top_p", "seed"],
)
def ruler_hqa(
    model: common.ModelOption,
    data: common.RulerDataOption,
    num_docs: common.NumDocsOption,
    out: common.OutOption,
    config: MemAgentConfig,
    serving: common.EngineChoice,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Evaluate the first K records per N.")
    ] = None,
    num_samples: Annotated[int, typer.Option(
        "--n", min=1, help="Trajectories per record (as rollout.n in training).")] = 1,
    protocol: Annotated[
        str,
        typer.Option(help="How the final answer is asked for and scored: memagent (MemAgent's "
                     "published evaluation) or memagent-boxed (the training format); see "
                     "docs/protocols.md."),
    ] = "memagent-boxed",
    pool: Annotated[
        Path | None,
        typer.Option("--pool", help="HotpotQA dev JSON that index-list files (MemAgent's "
                     "eval_12800 / eval_25600) point into."),
    ] = None,
    records_per_run: Annotated[
        int, typer.Option(min=1, help="Records run in lockstep and saved together (a kill "
                          "loses at most these).")
    ] = DEFAULT_RECORDS_PER_RUN,
    resume: common.ResumeEvalOption = False,
    quiet: Annotated[bool, typer.Option(help="Hide the progress bars.")] = False,
) -> None:
    """Run MemAgent on RULER-HQA for each N; write results.json, trajectories, plot, table."""
    from memrl.data.ruler_hqa import ruler_hqa_path
    from memrl.eval.resume import check_same_run
    from memrl.eval.ruler_hqa import evaluate_ruler_hqa

    if protocol not in PROTOCOLS:
        raise MemrlInputError(
            f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}",
            location="--protocol",
        )
    common.check_model_dir(model)
    common.check_out_dir(out)
    if not data.is_dir():
        raise MemrlInputError("data directory not found", location=f"--data {data}")
    for n in num_docs:
        if not ruler_hqa_path(data, n).is_file():
            raise MemrlInputError(
                f"no RULER-HQA file for N={n} (build it with `memrl prepare ruler-hqa`)",
                location=str(ruler_hqa_path(data, n)),
            )
    if pool is not None and not pool.is_file():
        raise MemrlInputError("HotpotQA pool file not found", location=f"--pool {pool}")
    # refuse a run directory of another model/config/protocol before loading the model
    previous = check_same_run(out / "results.json", {
        "benchmark": "ruler_hqa", "model": str(model), "protocol": protocol,
        "config": config.model_dump(mode="json")})
    if resume and not previous:
        raise MemrlInputError("nothing to resume: no results.json here", location=f"--out {out}")
    settings = {"model": str(model), "data": str(data), "num_docs": num_docs, "limit": limit,
                "samples": num_samples, "protocol": protocol, "pool": None if pool is None
                else str(pool), "engine": serving.engine, "dtype": serving.dtype,
                "config": config.model_dump(mode="json")}
    with common.evaluation_ranks(serving) as dist, \
            common.record_eval(out, "eval ruler-hqa", engine=serving.engine,
                               device=serving.device, seed=config.seed, settings=settings), \
            common.eval_interruptible(out):
        generator = serving.load(model, seed=config.seed)
        evaluate_ruler_hqa(
            generator,
            data,
            num_docs,
            config=config,
            out_dir=out,
            limit=limit,
            num_samples=num_samples,
            records_per_run=records_per_run,
            protocol=protocol,
            pool=pool,
            resume=resume,
            model_name=str(model),
            show_progress=not quiet, dist=dist,
        )
    if dist.is_main:
        typer.echo(f"results written to {out}")

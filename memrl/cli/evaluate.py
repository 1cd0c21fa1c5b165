"""`memrl eval ...`: evaluate a model with a memory agent (no learning)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memrl.agents.memagent import MemAgentConfig
from memrl.cli.app import eval_app
from memrl.cli.common import (
    BaseUrlOption,
    GenerationBatchSizeOption,
    DeviceOption,
    DtypeOption,
    EngineOption,
    GpuMemoryOption,
    HealthCheckOption,
    RequestTimeoutOption,
    check_model_dir,
    check_out_dir,
    config_options,
    eval_interruptible,
    load_engine,
    record_eval,
)
from memrl.errors import MemrlInputError
from memrl.inference.config import DEFAULT_HEALTH_CHECK_S, DEFAULT_REQUEST_TIMEOUT_S
from memrl.eval.ruler_hqa import DEFAULT_RECORDS_PER_RUN
from memrl.tasks.memagent_qa import PROTOCOLS


@eval_app.command("ruler-hqa")
@config_options(
    MemAgentConfig,
    ["chunk_size", "max_chunks", "max_memory_tokens", "max_final_tokens", "temperature",
     "top_p", "seed"],
)
def ruler_hqa(
    model: Annotated[Path, typer.Option("--model", help="Model directory (HF format).")],
    data: Annotated[Path, typer.Option("--data", help="Directory holding eval_{N}.json files.")],
    num_docs: Annotated[
        list[int], typer.Option("--num-docs", help="Numbers of documents N, e.g. 50 100 200.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Run directory for results.")],
    config: MemAgentConfig,
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
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out (an error if there "
                           "is none); re-running into the same --out resumes anyway.")
    ] = False,
    generation_batch_size: GenerationBatchSizeOption = 32,
    engine: EngineOption = "hf",
    base_url: BaseUrlOption = None,
    request_timeout: RequestTimeoutOption = DEFAULT_REQUEST_TIMEOUT_S,
    health_check: HealthCheckOption = DEFAULT_HEALTH_CHECK_S,
    device: DeviceOption = None,
    dtype: DtypeOption = None,
    gpu_memory_utilization: GpuMemoryOption = None,
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
    check_model_dir(model)
    check_out_dir(out)
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
                else str(pool), "engine": engine, "dtype": dtype,
                "config": config.model_dump(mode="json")}
    with record_eval(out, "eval ruler-hqa", engine=engine, device=device, seed=config.seed,
                     settings=settings), eval_interruptible(out):
        generator = load_engine(
            model, device=device, dtype=dtype, generation_batch_size=generation_batch_size,
            seed=config.seed, engine=engine, base_urls=base_url,
            gpu_memory_utilization=gpu_memory_utilization,
            request_timeout=request_timeout, health_check=health_check,
        )
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
            show_progress=not quiet,
        )
    typer.echo(f"results written to {out}")

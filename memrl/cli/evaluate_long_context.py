"""`memrl eval long-context`: the same model reading the whole document at once (baseline)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memrl.cli.app import eval_app
from memrl.cli.common import (
    GenerationBatchSizeOption,
    DeviceOption,
    DtypeOption,
    EngineOption,
    GpuMemoryOption,
    check_model_dir,
    check_out_dir,
    config_options,
    eval_interruptible,
    load_engine,
)
from memrl.eval.long_context import LongContextConfig


@eval_app.command("long-context")
@config_options(LongContextConfig, ["window", "max_new_tokens", "temperature", "seed"])
def long_context(
    model: Annotated[Path, typer.Option("--model", help="Model directory (HF format).")],
    data: Annotated[Path, typer.Option("--data", help="Directory holding eval_{N}.json files.")],
    num_docs: Annotated[
        list[int], typer.Option("--num-docs", help="Numbers of documents N, e.g. 50 100 200.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Run directory for results.")],
    config: LongContextConfig,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Evaluate the first K records per N.")
    ] = None,
    generation_batch_size: GenerationBatchSizeOption = 8,
    engine: EngineOption = "hf",
    device: DeviceOption = None,
    dtype: DtypeOption = None,
    gpu_memory_utilization: GpuMemoryOption = None,
) -> None:
    """The whole document and the question in one prompt (MemAgent's long-context baseline);
    N whose documents exceed the model's window are reported as "does not fit"."""
    from memrl.errors import MemrlInputError
    from memrl.eval.long_context import evaluate_long_context, model_window

    check_model_dir(model)
    check_out_dir(out)
    if not data.is_dir():
        raise MemrlInputError("data directory not found", location=f"--data {data}")
    if config.window is None:
        config = config.model_copy(update={"window": model_window(model)})
    with eval_interruptible(out):
        generator = load_engine(model, device=device, dtype=dtype,
                                generation_batch_size=generation_batch_size,
                                seed=config.seed, engine=engine,
                                gpu_memory_utilization=gpu_memory_utilization)
        evaluate_long_context(generator, data, num_docs, out_dir=out, config=config,
                              limit=limit, model_name=str(model))
    typer.echo(f"results written to {out}")

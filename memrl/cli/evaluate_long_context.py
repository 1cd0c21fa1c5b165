"""`memrl eval long-context`: the same model reading the whole document at once (baseline)."""

from __future__ import annotations

from typing import Annotated

import typer

from memrl.cli.app import eval_app
from memrl.cli import common
from memrl.eval.long_context import LongContextConfig


@eval_app.command("long-context")
@common.engine_options([*common.LOCAL, *common.VLLM], generation_batch_size=8)
@common.config_options(LongContextConfig, ["window", "max_new_tokens", "temperature", "seed"])
def long_context(
    model: common.ModelOption,
    data: common.RulerDataOption,
    num_docs: common.NumDocsOption,
    out: common.OutOption,
    config: LongContextConfig,
    serving: common.EngineChoice,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Evaluate the first K records per N.")
    ] = None,
) -> None:
    """The whole document and the question in one prompt (MemAgent's long-context baseline);
    N whose documents exceed the model's window are reported as "does not fit"."""
    from memrl.errors import MemrlInputError
    from memrl.eval.long_context import evaluate_long_context, model_window

    common.check_model_dir(model)
    common.check_out_dir(out)
    if not data.is_dir():
        raise MemrlInputError("data directory not found", location=f"--data {data}")
    if config.window is None:
        config = config.model_copy(update={"window": model_window(model)})
    with common.eval_interruptible(out):
        generator = serving.load(model, seed=config.seed)
        evaluate_long_context(generator, data, num_docs, out_dir=out, config=config,
                              limit=limit, model_name=str(model))
    typer.echo(f"results written to {out}")

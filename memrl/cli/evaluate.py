"""`memrl eval ...`: evaluate a model with a memory agent (no learning)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memrl.agents.memagent import MemAgentConfig
from memrl.cli.app import eval_app
from memrl.cli.common import check_model_dir, config_options, load_generator
from memrl.errors import MemrlInputError


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
    samples: Annotated[int, typer.Option(min=1, help="Trajectories per record.")] = 1,
    batch_size: Annotated[
        int, typer.Option(min=1, help="Prompts per forward pass of the generator (micro-batch).")
    ] = 32,
    engine: Annotated[
        str, typer.Option(help="Generation engine: hf (in-process), vllm, openai (servers).")
    ] = "hf",
    base_url: Annotated[
        list[str] | None,
        typer.Option("--base-url", help="A vLLM OpenAI-compatible server (--engine openai); "
                     "repeat for several."),
    ] = None,
    device: Annotated[str | None, typer.Option(help="torch device, e.g. cuda, cpu.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Model dtype, e.g. bfloat16.")] = None,
    quiet: Annotated[bool, typer.Option(help="Hide the progress bars.")] = False,
) -> None:
    """Run MemAgent on RULER-HQA for each N; write results.json, trajectories, plot, table."""
    from memrl.data.ruler_hqa import ruler_hqa_path
    from memrl.eval.ruler_hqa import evaluate_ruler_hqa

    check_model_dir(model)
    if not data.is_dir():
        raise MemrlInputError("data directory not found", location=f"--data {data}")
    for n in num_docs:
        if not ruler_hqa_path(data, n).is_file():
            raise MemrlInputError(
                f"no RULER-HQA file for N={n} (build it with `memrl prepare ruler-hqa`)",
                location=str(ruler_hqa_path(data, n)),
            )
    generator = load_generator(
        model, device=device, dtype=dtype, batch_size=batch_size, seed=config.seed,
        engine=engine, base_urls=base_url,
    )
    evaluate_ruler_hqa(
        generator,
        data,
        num_docs,
        config=config,
        out_dir=out,
        limit=limit,
        num_samples=samples,
        model_name=str(model),
        show_progress=not quiet,
    )
    typer.echo(f"results written to {out}")

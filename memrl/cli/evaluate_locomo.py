"""`memrl eval locomo`: the MemoryUpdate agent on prepared LoCoMo episodes (no learning)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from memrl.agents.memupdate import MemUpdateConfig
from memrl.cli.app import eval_app
from memrl.cli import common
from memrl.errors import MemrlInputError

_SEPARATORS = re.compile(r"[\s,]+")


def parse_categories(values: list[str] | None) -> list[int]:
    """`--categories 1,2 --categories 4` (or "1 2 4") -> [1, 2, 4]; default 1-4."""
    from memrl.eval.locomo import DEFAULT_CATEGORIES, check_categories

    if not values:
        return list(DEFAULT_CATEGORIES)
    out = []
    for value in values:
        for part in _SEPARATORS.split(value.strip()):
            if not part:
                continue
            try:
                out.append(int(part))
            except ValueError:
                raise MemrlInputError(
                    f"{part!r} is not a category number (1-5)", location="--categories"
                ) from None
    return check_categories(out)


@eval_app.command("locomo")
@common.engine_options([*common.LOCAL, *common.POOL, *common.VLLM, *common.DATA_PARALLEL])
@common.config_options(
    MemUpdateConfig,
    ["embedder", "answerer", "top_k", "max_turns", "max_parallel_calls", "max_response_tokens",
     "max_tool_response_length", "session_chunk_turns", "memory_view_k", "efficiency_budget",
     "temperature", "top_p", "seed"],
)
def locomo(
    model: common.ModelOption,
    data: Annotated[
        Path, typer.Option("--data", help="Output directory of `memrl prepare locomo`.")
    ],
    out: common.OutOption,
    config: MemUpdateConfig,
    serving: common.EngineChoice,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Evaluate the first K episodes.")
    ] = None,
    categories: Annotated[
        list[str] | None,
        typer.Option("--categories", help="LoCoMo categories, e.g. 1,2,3,4 (5 = adversarial)."),
    ] = None,
    num_samples: Annotated[int, typer.Option(
        "--n", min=1, help="Trajectories per episode (as rollout.n in training).")] = 1,
    split: Annotated[
        str, typer.Option(help="Conversations to evaluate: all, or the train / heldout side "
                          "of the conversation split (held out: conv-48, conv-49, conv-50).")
    ] = "all",
    judge_model: Annotated[
        Path | None,
        typer.Option("--judge-model", help="Model directory (HF format) of the LLM judge "
                     "(mem0's judge prompt, greedy); adds the judge accuracy."),
    ] = None,
    resume: common.ResumeEvalOption = False,
    episodes_per_run: Annotated[
        int, typer.Option(min=1, help="Episodes run together in lockstep.")
    ] = 32,
    quiet: Annotated[bool, typer.Option(help="Hide the progress bar.")] = False,
) -> None:
    """Run the MemoryUpdate agent on LoCoMo; write results.json, results.md, trajectories."""
    from memrl.data.locomo import EPISODES_FILE
    from memrl.data.locomo import check_split
    from memrl.eval.locomo import evaluate_locomo

    split = check_split(split)  # an unknown split is an error before any loading
    common.check_model_dir(model)
    common.check_out_dir(out)
    if judge_model is not None:
        try:
            common.check_model_dir(judge_model)
        except MemrlInputError as exc:
            raise MemrlInputError(exc.message, location=f"--judge-model {judge_model}") from None
    if not data.is_dir():
        raise MemrlInputError("data directory not found", location=f"--data {data}")
    if not (data / EPISODES_FILE).is_file():
        raise MemrlInputError(
            f"no {EPISODES_FILE} (build it with `memrl prepare locomo`)", location=f"--data {data}"
        )
    cats = parse_categories(categories)
    settings = {"model": str(model), "data": str(data), "limit": limit, "categories": cats,
                "samples": num_samples, "split": split, "engine": serving.engine,
                "dtype": serving.dtype,
                "judge_model": None if judge_model is None else str(judge_model),
                "config": config.model_dump(mode="json")}
    with common.evaluation_ranks(serving) as dist, \
            common.record_eval(out, "eval locomo", engine=serving.engine,
                               device=serving.device, seed=config.seed, settings=settings), \
            common.eval_interruptible(out):
        generator = serving.load(model, seed=config.seed)
        judge = None
        if judge_model is not None:
            judge = generator if judge_model.resolve() == model.resolve() else \
                serving.model_copy(update={"engine": "hf"}).load(judge_model, seed=config.seed)
        evaluate_locomo(
            generator,
            data,
            config=config,
            out_dir=out,
            categories=cats,
            limit=limit,
            num_samples=num_samples,
            episodes_per_run=episodes_per_run,
            split=split,
            judge=judge,
            judge_name=None if judge_model is None else str(judge_model),
            resume=resume,
            model_name=str(model),
            show_progress=not quiet, dist=dist,
        )
    if dist.is_main:
        typer.echo(f"results written to {out}")

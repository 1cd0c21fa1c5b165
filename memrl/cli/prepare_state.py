"""`memrl prepare where-now | where-before | who-has | counting | knowledge-update`: the
state-tracking benchmarks (memrl.data.state_tracking), one command each, the same options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from memrl.cli.app import prepare_app
from memrl.data.state_tracking import (
    DEFAULT_BLOCK_CHARS,
    DEFAULT_EVAL_DOCS,
    TASKS,
    WRITE_SPLITS,
    StateFiles,
    write_state_tracking,
)
from memrl.errors import MemrlInputError
from memrl.fileio import check_output_dir

console = Console(soft_wrap=True)

SUMMARIES = {
    "where-now": "Where is a person now? People move between places; the answer is the last "
                 "place (bAbI qa1).",
    "where-before": "Where was an object before a place? Objects are carried, passed and "
                    "dropped (bAbI qa3: three supporting facts).",
    "who-has": "Who has an object now? Objects are picked up, passed and dropped.",
    "counting": "How many times did a person go to a place / how many objects does a person "
                "hold now? The count accumulates over the whole document.",
    "knowledge-update": "What is a person's city / job now? Stated, then changed later; the "
                        "latest value is the answer, the superseded ones distractors.",
}


def _prepare(
    task: str,
    out: Path,
    split: str,
    train_questions: int,
    train_docs: int,
    val_questions: int,
    eval_questions: int,
    num_docs: list[int] | None,
    haystack: Path | None,
    block_chars: int,
    seed: int,
) -> None:
    if split not in WRITE_SPLITS:
        raise MemrlInputError(f"must be one of {', '.join(WRITE_SPLITS)}, got '{split}'",
                              location="--split")
    if num_docs and split == "train":
        raise MemrlInputError("sets the evaluation files' N: not with --split train (use "
                              "--train-docs)", location="--num-docs")
    check_output_dir(out, location=f"--out {out}")
    spec = StateFiles(split=split, seed=seed, train_questions=train_questions,
                      train_docs=train_docs, val_questions=val_questions,
                      eval_questions=eval_questions,
                      eval_docs=tuple(num_docs or DEFAULT_EVAL_DOCS),
                      haystack=None if haystack is None else str(haystack),
                      block_chars=block_chars)
    paths = write_state_tracking(task, out, spec)
    source = haystack or "memrl biographies (generated)"
    console.print(f"{task}: seed {seed}, filler {source}, {block_chars} characters a block")
    for path in paths:
        console.print(f"[green]wrote[/green] {path} ({path.stat().st_size / 1e6:.1f} MB)")


def _register(task: str) -> None:
    def command(
        out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the files.")],
        split: Annotated[str, typer.Option("--split", help=(
            "train: train.json + val.json; eval: eval_{N}.json for each --num-docs; all: "
            "both."))] = "all",
        train_questions: Annotated[int, typer.Option("--train-questions")] = 2000,
        train_docs: Annotated[int, typer.Option(
            "--train-docs", help="Filler blocks per training (and validation) question.")] = 10,
        val_questions: Annotated[int, typer.Option(
            "--val-questions", help="Held-out validation questions (0: no val.json).")] = 64,
        eval_questions: Annotated[int, typer.Option(
            "--eval-questions", help="Held-out questions, the same at every N.")] = 128,
        num_docs: Annotated[list[int] | None, typer.Option(
            "--num-docs", help="Filler blocks per evaluation context (N); default "
            f"{' '.join(map(str, DEFAULT_EVAL_DOCS))}: 1x-64x, about 1.5K-93K tokens of the "
            "default filler (1M: 6900).")] = None,
        haystack: Annotated[Path | None, typer.Option(
            "--haystack", help="Filler from this text file (any UTF-8 text, e.g. a book); "
            "default: memrl's generated biographies.")] = None,
        block_chars: Annotated[int, typer.Option(
            "--block-chars", help="Least characters per filler block (one unit of N).")
        ] = DEFAULT_BLOCK_CHARS,
        seed: Annotated[int, typer.Option("--seed")] = 0,
    ) -> None:
        _prepare(task, out, split, train_questions, train_docs, val_questions, eval_questions,
                 num_docs, haystack, block_chars, seed)

    command.__doc__ = (f"{SUMMARIES[task]} Writes train.json, val.json (train with "
                       "data.format: ruler) and eval_{N}.json (memrl eval).")
    prepare_app.command(task)(command)


for _task in TASKS:
    _register(_task)

"""`memrl prepare where-now | where-before | who-has | counting | knowledge-update --out DIR
[key=value ...]`: the state-tracking benchmarks (memrl.data.state_tracking), one command each,
the same keys (memrl.data.prepare_config.StatePrepare)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memrl.cli.app import prepare_app
from memrl.cli.prepare import Keys, console, print_written
from memrl.config import load_command_config
from memrl.data.prepare_config import StatePrepare
from memrl.data.state_tracking import TASKS, StateFiles, write_state_tracking
from memrl.fileio import check_output_dir

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


def state_files(cfg: StatePrepare) -> StateFiles:
    """What `write_state_tracking` writes, from the command's config."""
    return StateFiles(split=cfg.split, seed=cfg.seed, train_questions=cfg.train_questions,
                      train_docs=cfg.train_docs, val_questions=cfg.val_questions,
                      eval_questions=cfg.eval_questions, eval_docs=tuple(cfg.num_docs),
                      haystack=cfg.haystack, block_chars=cfg.block_chars)


def _prepare(task: str, out: Path, args: list[str] | None) -> None:
    cfg = load_command_config(StatePrepare, args)
    check_output_dir(out, location=f"--out {out}")
    paths = write_state_tracking(task, out, state_files(cfg))
    source = cfg.haystack or "memrl biographies (generated)"
    console.print(f"{task}: seed {cfg.seed}, filler {source}, {cfg.block_chars} characters "
                  "a block")
    print_written(paths)


def _register(task: str) -> None:
    def command(
        out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the files.")],
        args: Keys = None,
    ) -> None:
        _prepare(task, out, args)

    command.__doc__ = (f"{SUMMARIES[task]} Writes train.json, val.json (train with "
                       "data.format: ruler) and eval_{N}.json (memrl eval). Keys: split, "
                       "num_docs, train_questions, train_docs, val_questions, eval_questions, "
                       "haystack, block_chars, seed (docs/configuration.md).")
    prepare_app.command(task)(command)


for _task in TASKS:
    _register(_task)

"""`memrl prepare ...`: convert data sets into memrl's files (thin wrappers over memrl.data)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from memrl.cli.app import prepare_app
from memrl.data.hotpotqa import FORMATS, load_hotpotqa, save_records
from memrl.data.records import QARecord
from memrl.data.ruler_hqa import INCLUDE_MODES, write_ruler_hqa
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.fileio import check_output_dir, check_output_file

console = Console(soft_wrap=True)


def _describe(records: list[QARecord]) -> str:
    n_docs = sum(len(r.documents) for r in records)
    n_gold = sum(1 for r in records for d in r.documents if d.is_supporting)
    text = f"{len(records)} questions"
    if n_docs:
        text += f", {n_docs / len(records):.1f} paragraphs per question, {n_gold} gold paragraphs"
    return text


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise MemrlInputError(f"{name} must be one of {', '.join(choices)}, got '{value}'")


@prepare_app.command("hotpotqa")
def prepare_hotpotqa(
    input: Annotated[str, typer.Option("--input", "-i", help="File, or hf:NAME[:SPLIT].")],
    output: Annotated[Path, typer.Option("--output", "-o", help="OUT.jsonl or OUT.parquet.")],
    format: Annotated[
        str, typer.Option("--format", help=f"One of: {', '.join(FORMATS)}.")
    ] = "auto",
) -> None:
    """Read HotpotQA (official / IRCoT / memrl / parquet / hf) and write memrl JSONL or parquet."""
    _check_choice("--format", format, FORMATS)
    if output.suffix.lower() not in (".jsonl", ".parquet"):
        raise MemrlInputError(f"--output must end in .jsonl or .parquet, got '{output}'")
    check_output_file(output, location=f"--output {output}")
    records = load_hotpotqa(input, format=format)
    path = save_records(records, output)
    console.print(f"[green]wrote[/green] {path}: {_describe(records)}")


@prepare_app.command("ruler-hqa")
def prepare_ruler_hqa(
    input: Annotated[str, typer.Option("--input", "-i", help="HotpotQA source (any format).")],
    num_docs: Annotated[
        list[int], typer.Option("--num-docs", help="Documents per context, e.g. 50 100 200.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory for eval_{N}.json.")],
    seed: Annotated[int, typer.Option("--seed")] = 42,
    num_questions: Annotated[
        int | None, typer.Option("--num-questions", help="Sample K questions.")
    ] = None,
    include: Annotated[str, typer.Option("--include", help=(
        "gold: gold + other questions' paragraphs; all: the question's own paragraphs first."
    ))] = "gold",
) -> None:
    """Build RULER-HQA files (MemAgent's eval_{N}.json) from HotpotQA questions."""
    _check_choice("--include", include, INCLUDE_MODES)
    check_output_dir(out, location=f"--out {out}")
    records = load_hotpotqa(input)
    paths = write_ruler_hqa(records, out, num_docs, seed, num_questions=num_questions,
                            include=include)
    n_questions = num_questions if num_questions is not None else len(records)
    console.print(
        f"RULER-HQA from {input}: {n_questions} questions, seed {seed}, include {include}"
    )
    for n, path in zip(dict.fromkeys(num_docs), paths):
        size = path.stat().st_size / 1e6
        console.print(f"[green]wrote[/green] {path}: num_docs={n}, {size:.1f} MB")


@prepare_app.command("synthetic")
def prepare_synthetic(
    out: Annotated[Path, typer.Option("--out", "-o", help="OUT.jsonl or OUT.parquet.")],
    num_questions: Annotated[int, typer.Option("--num-questions")] = 100,
    num_docs: Annotated[
        list[int] | None, typer.Option("--num-docs", help="Paragraphs per question (one value).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Write deterministic two-hop questions over fictional entities (offline data)."""
    if num_docs and len(num_docs) > 1:
        raise MemrlInputError(f"--num-docs takes one value here, got {len(num_docs)}")
    check_output_file(out, location=f"--out {out}")
    records = make_synthetic_records(num_questions, num_docs=num_docs[0] if num_docs else 10,
                                     seed=seed)
    path = save_records(records, out)
    console.print(f"[green]wrote[/green] {path}: {_describe(records)}")

"""`memrl prepare ...`: convert data sets into memrl's files (thin wrappers over memrl.data)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from memrl.cli.app import prepare_app
from memrl.data.biographies import (
    DEFAULT_HARD_SHARE,
    NAME_POOLS,
    WRITE_SPLITS,
    write_biographies,
)
from memrl.data.hotpotqa import FORMATS, load_hotpotqa, save_memagent_rows, save_records
from memrl.data.records import QARecord
from memrl.data.ruler_hqa import (
    INCLUDE_MODES,
    MEMAGENT_SEED,
    MEMAGENT_SHUFFLE_SEED,
    STYLES,
    load_hotpotqa_pool,
    memagent_pool,
    memagent_training_rows,
    write_memagent_ruler_hqa,
    write_ruler_hqa,
)
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


def _question_positions(records: list[QARecord], num_questions: int | None,
                        filter_models: list[str] | None, filter_samples: int,
                        device: str | None, dtype: str | None,
                        filter_batch_size: int) -> list[int]:
    """MemAgent's selection: the first K questions in input order, or with --filter-model the
    first K that no filter model answers without context."""
    if num_questions is not None and num_questions < 1:
        raise MemrlInputError(f"must be at least 1, got {num_questions}",
                              location="--num-questions")
    if not filter_models:
        if num_questions is not None and num_questions > len(records):
            raise MemrlInputError(
                f"{num_questions} asked for but the input has only {len(records)} questions",
                location="--num-questions",
            )
        return list(range(len(records) if num_questions is None else num_questions))
    from memrl.cli.common import config_from_options, load_engine
    from memrl.eval.closed_book import ClosedBookConfig, select_unanswered

    config = config_from_options(ClosedBookConfig, samples=filter_samples,
                                 batch_size=filter_batch_size)
    generators = [load_engine(Path(m), device=device, dtype=dtype,
                              generation_batch_size=filter_batch_size * filter_samples,
                              seed=None)
                  for m in filter_models]

    def report(done: int, kept: int) -> None:
        console.print(f"filter: {done} questions asked, {kept} not answered without context")

    kept = select_unanswered(generators, records, num_questions, config, progress=report)
    if not kept:
        raise MemrlInputError("every question was answered without context by the filter "
                              "model(s); nothing to write", location="--filter-model")
    if num_questions is not None and len(kept) < num_questions:
        console.print(f"[yellow]warning[/yellow]: only {len(kept)} of {len(records)} questions "
                      f"pass the filter (asked for {num_questions}); writing those")
    return kept


FilterModels = Annotated[list[str] | None, typer.Option(
    "--filter-model", help="Keep only questions this model (HF directory or cached hub id) "
    "cannot answer without context (MemAgent's filter). Repeat for several models.")]
FilterSamples = Annotated[int, typer.Option(
    "--filter-samples", help="Replies per filter model and question (MemAgent: 2).")]
FilterBatch = Annotated[int, typer.Option(
    "--filter-batch-size", help="Questions per generate call of the filter.")]
Device = Annotated[str | None, typer.Option("--device", help="Filter models' device.")]
Dtype = Annotated[str | None, typer.Option("--dtype", help="Filter models' dtype.")]


@prepare_app.command("ruler-hqa")
def prepare_ruler_hqa(
    input: Annotated[str, typer.Option("--input", "-i", help="HotpotQA source (any format).")],
    num_docs: Annotated[
        list[int], typer.Option("--num-docs", help="Documents per context, e.g. 50 100 200.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory for eval_{N}.json.")],
    seed: Annotated[int, typer.Option("--seed")] = 42,
    num_questions: Annotated[
        int | None, typer.Option("--num-questions", help=(
            "memrl style: sample K questions; memagent style: the first K (after the filter)."
        ))
    ] = None,
    include: Annotated[str | None, typer.Option("--include", help=(
        "memrl style only. gold: gold + other questions' paragraphs (default); all: the "
        "question's own paragraphs first."
    ))] = None,
    style: Annotated[str, typer.Option("--style", help=(
        "memrl: memrl's builder; memagent: MemAgent's published builder (each question's own "
        "paragraphs + random ones from the whole input pool, one permutation per N)."
    ))] = "memrl",
    shuffle_seed: Annotated[int, typer.Option(
        "--shuffle-seed", help="memagent style: seed of the one permutation per N.")
    ] = MEMAGENT_SHUFFLE_SEED,
    index_list_from: Annotated[int | None, typer.Option(
        "--index-list-from", help="memagent style: files with N at least this store context "
        "as pool indices (MemAgent: N > 10000); needs the official HotpotQA JSON as input.")
    ] = None,
    filter_model: FilterModels = None,
    filter_samples: FilterSamples = 2,
    filter_batch_size: FilterBatch = 64,
    device: Device = None,
    dtype: Dtype = None,
) -> None:
    """Build RULER-HQA files (MemAgent's eval_{N}.json) from HotpotQA questions."""
    _check_choice("--style", style, STYLES)
    check_output_dir(out, location=f"--out {out}")
    if style == "memrl":
        for flag, given in (("--index-list-from", index_list_from is not None),
                            ("--filter-model", bool(filter_model)),
                            ("--shuffle-seed", shuffle_seed != MEMAGENT_SHUFFLE_SEED)):
            if given:
                raise MemrlInputError("only with --style memagent", location=flag)
        include = include or "gold"
        _check_choice("--include", include, INCLUDE_MODES)
        records = load_hotpotqa(input)
        paths = write_ruler_hqa(records, out, num_docs, seed, num_questions=num_questions,
                                include=include)
        n_questions = num_questions if num_questions is not None else len(records)
        console.print(
            f"RULER-HQA from {input}: {n_questions} questions, seed {seed}, include {include}"
        )
    else:
        if include is not None:
            raise MemrlInputError("only with --style memrl (MemAgent keeps all of a "
                                  "question's own paragraphs)", location="--include")
        records = load_hotpotqa(input)
        if index_list_from is not None and any(n >= index_list_from for n in num_docs):
            _check_pool_file(input, records)
        positions = _question_positions(records, num_questions, filter_model, filter_samples,
                                        device, dtype, filter_batch_size)
        paths = write_memagent_ruler_hqa(records, out, num_docs, questions=positions,
                                         seed=seed, shuffle_seed=shuffle_seed,
                                         index_list_from=index_list_from)
        console.print(
            f"RULER-HQA (MemAgent style) from {input}: {len(positions)} questions, pool of "
            f"{len(memagent_pool(records).docs)} paragraphs, seed {seed}, shuffle seed "
            f"{shuffle_seed}"
        )
    for n, path in zip(dict.fromkeys(num_docs), paths):
        size = path.stat().st_size / 1e6
        listed = style == "memagent" and index_list_from is not None and n >= index_list_from
        kind = ", index list (load with --pool " + input + ")" if listed else ""
        console.print(f"[green]wrote[/green] {path}: num_docs={n}, {size:.1f} MB{kind}")


def _check_pool_file(input: str, records: list[QARecord]) -> None:
    """Index-list files are read back with `--pool INPUT`: the input must be a file whose
    pool `load_hotpotqa_pool` rebuilds (the official HotpotQA JSON)."""
    try:
        docs = load_hotpotqa_pool(input)
    except MemrlInputError:
        docs = None
    if docs != memagent_pool(records).docs:
        raise MemrlInputError(
            "index-list files need the official HotpotQA JSON as --input (its pool is what "
            "--pool reads back)", location="--index-list-from"
        )


@prepare_app.command("memagent-parquet")
def prepare_memagent_parquet(
    input: Annotated[str, typer.Option("--input", "-i", help="HotpotQA source (any format).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="OUT.parquet.")],
    num_docs: Annotated[int, typer.Option(
        "--num-docs", help="Paragraphs per question (MemAgent: 200).")] = 200,
    num_questions: Annotated[int | None, typer.Option(
        "--num-questions", help="The first K questions (after the filter); MemAgent: 8192 "
        "for training, 128 for validation.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = MEMAGENT_SEED,
    shuffle_seed: Annotated[int, typer.Option(
        "--shuffle-seed", help="Seed of the one permutation per N.")] = MEMAGENT_SHUFFLE_SEED,
    filter_model: FilterModels = None,
    filter_samples: FilterSamples = 2,
    filter_batch_size: FilterBatch = 64,
    device: Device = None,
    dtype: Dtype = None,
) -> None:
    """MemAgent-style training/validation parquet (data_source, prompt, context, ability,
    reward_model, extra_info), built like `prepare ruler-hqa --style memagent`."""
    if output.suffix.lower() != ".parquet":
        raise MemrlInputError(f"must end in .parquet, got '{output}'", location="--output")
    check_output_file(output, location=f"--output {output}")
    records = load_hotpotqa(input)
    positions = _question_positions(records, num_questions, filter_model, filter_samples,
                                    device, dtype, filter_batch_size)
    rows = memagent_training_rows(records, num_docs, questions=positions, seed=seed,
                                  shuffle_seed=shuffle_seed)
    path = save_memagent_rows(rows, output)
    size = path.stat().st_size / 1e6
    console.print(f"[green]wrote[/green] {path}: {len(rows)} questions, num_docs={num_docs}, "
                  f"{size:.1f} MB")


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


@prepare_app.command("biographies")
def prepare_biographies(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the files.")],
    split: Annotated[str, typer.Option("--split", help=(
        "train: train.jsonl + val.jsonl; eval: eval_{N}.json for each --num-docs; all: both."
    ))] = "all",
    train_questions: Annotated[int, typer.Option("--train-questions")] = 10_000,
    train_docs: Annotated[int, typer.Option(
        "--train-docs", help="Biographies per training (and validation) question.")] = 16,
    val_questions: Annotated[int, typer.Option(
        "--val-questions", help="Held-out validation questions (0: no val.jsonl).")] = 64,
    eval_questions: Annotated[int, typer.Option(
        "--eval-questions", help="Held-out questions, the same at every N.")] = 128,
    num_docs: Annotated[list[int] | None, typer.Option(
        "--num-docs", help="Biographies per evaluation question, e.g. 16 32 64 ... 1024.")
    ] = None,
    hard_share: Annotated[float, typer.Option(
        "--hard-share", help="Share of distractors sharing the asked person's first or last "
        "name.")] = DEFAULT_HARD_SHARE,
    names: Annotated[str, typer.Option("--names", help=(
        "distinct: names from ~1,100 first and last names per split, namesakes only where "
        "placed; shared: a small pool of each, so first names and surnames recur among many "
        "people and every context holds namesakes stating the asked attribute."))] = "distinct",
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Write the biographies task (natural sentences, namesake distractors, held-out people
    and sentence forms): train.jsonl, val.jsonl and eval_{N}.json."""
    _check_choice("--split", split, WRITE_SPLITS)
    _check_choice("--names", names, NAME_POOLS)
    if num_docs and split == "train":
        raise MemrlInputError("sets the evaluation files' N: not with --split train (use "
                              "--train-docs)", location="--num-docs")
    check_output_dir(out, location=f"--out {out}")
    eval_docs = num_docs or [16, 32, 64, 128, 256, 512, 1024]
    paths = write_biographies(out, split=split, seed=seed, train_questions=train_questions,
                              train_docs=train_docs, val_questions=val_questions,
                              eval_questions=eval_questions, eval_docs=eval_docs,
                              hard_share=hard_share, names=names)
    for path in paths:
        console.print(f"[green]wrote[/green] {path} ({path.stat().st_size / 1e6:.1f} MB)")

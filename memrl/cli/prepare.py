"""`memrl prepare ...`: convert data sets into memrl's files (thin wrappers over memrl.data).

Every command is `memrl prepare NAME --input SRC --out DEST [CONFIG] [key=value ...]`: the paths
are options, the settings keys of the generator's typed config (memrl.data.prepare_config;
docs/configuration.md lists them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from memrl.cli.app import prepare_app
from memrl.config import load_command_config
from memrl.data.biographies import write_biographies
from memrl.data.hotpotqa import load_hotpotqa, save_memagent_rows, save_records
from memrl.data.prepare_config import (
    BiographiesPrepare,
    HotpotqaPrepare,
    MemagentParquetPrepare,
    MemagentQuestions,
    RulerHqaPrepare,
    SyntheticPrepare,
)
from memrl.data.records import QARecord
from memrl.data.ruler_hqa import (
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

Keys = Annotated[list[str] | None, typer.Argument(
    help="CONFIG and/or key=value settings of the generator (docs/configuration.md, "
         "`memrl prepare`), e.g. num_docs=[50,100] seed=1.", show_default=False)]


def _describe(records: list[QARecord]) -> str:
    n_docs = sum(len(r.documents) for r in records)
    n_gold = sum(1 for r in records for d in r.documents if d.is_supporting)
    text = f"{len(records)} questions"
    if n_docs:
        text += f", {n_docs / len(records):.1f} paragraphs per question, {n_gold} gold paragraphs"
    return text


@prepare_app.command("hotpotqa")
def prepare_hotpotqa(
    input: Annotated[str, typer.Option("--input", "-i", help="File, or hf:NAME[:SPLIT].")],
    output: Annotated[Path, typer.Option("--output", "-o", help="OUT.jsonl or OUT.parquet.")],
    args: Keys = None,
) -> None:
    """Read HotpotQA (official / IRCoT / memrl / parquet / hf) and write memrl JSONL or parquet.
    Key: format (auto, official, ircot, memrl, parquet, hf)."""
    cfg = load_command_config(HotpotqaPrepare, args)
    if output.suffix.lower() not in (".jsonl", ".parquet"):
        raise MemrlInputError(f"--output must end in .jsonl or .parquet, got '{output}'")
    check_output_file(output, location=f"--output {output}")
    records = load_hotpotqa(input, format=cfg.format)
    path = save_records(records, output)
    console.print(f"[green]wrote[/green] {path}: {_describe(records)}")


def _memagent_questions(records: list[QARecord], cfg: MemagentQuestions) -> list[int]:
    """MemAgent's selection of the questions: the first `num_questions` in input order, or
    with `filter.models` the first that no filter model answers without context."""
    n = cfg.num_questions
    if not cfg.filter.models:
        if n is not None and n > len(records):
            raise MemrlInputError(
                f"{n} asked for but the input has only {len(records)} questions",
                location="num_questions")
        return list(range(len(records) if n is None else n))
    from memrl.cli.common import config_from_options, load_engine
    from memrl.eval.closed_book import ClosedBookConfig, select_unanswered

    f = cfg.filter
    config = config_from_options(ClosedBookConfig, samples=f.samples, batch_size=f.batch_size)
    generators = [load_engine(Path(m), device=f.device, dtype=f.dtype,
                              generation_batch_size=f.batch_size * f.samples, seed=None)
                  for m in f.models]

    def report(done: int, kept: int) -> None:
        console.print(f"filter: {done} questions asked, {kept} not answered without context")

    kept = select_unanswered(generators, records, n, config, progress=report)
    if not kept:
        raise MemrlInputError("every question was answered without context by the filter "
                              "model(s); nothing to write", location="filter.models")
    if n is not None and len(kept) < n:
        console.print(f"[yellow]warning[/yellow]: only {len(kept)} of {len(records)} questions "
                      f"pass the filter (asked for {n}); writing those")
    return kept


@prepare_app.command("ruler-hqa")
def prepare_ruler_hqa(
    input: Annotated[str, typer.Option("--input", "-i", help="HotpotQA source (any format).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for eval_{N}.json.")],
    args: Keys = None,
) -> None:
    """Build RULER-HQA files (MemAgent's eval_{N}.json) from HotpotQA questions. Keys:
    num_docs (required, e.g. [50,100,200]), seed, num_questions, style (memrl, memagent),
    include, shuffle_seed, index_list_from, filter.models / samples / batch_size / device /
    dtype (docs/configuration.md)."""
    cfg = load_command_config(RulerHqaPrepare, args)
    check_output_dir(out, location=f"--out {out}")
    if cfg.style == "memrl":
        include = cfg.include or "gold"
        records = load_hotpotqa(input)
        paths = write_ruler_hqa(records, out, cfg.num_docs, cfg.seed,
                                num_questions=cfg.num_questions, include=include)
        n_questions = cfg.num_questions if cfg.num_questions is not None else len(records)
        console.print(f"RULER-HQA from {input}: {n_questions} questions, seed {cfg.seed}, "
                      f"include {include}")
    else:
        records = load_hotpotqa(input)
        if cfg.index_list_from is not None and max(cfg.num_docs) >= cfg.index_list_from:
            _check_pool_file(input, records)
        positions = _memagent_questions(records, cfg)
        paths = write_memagent_ruler_hqa(records, out, cfg.num_docs, questions=positions,
                                         seed=cfg.seed, shuffle_seed=cfg.shuffle_seed,
                                         index_list_from=cfg.index_list_from)
        console.print(
            f"RULER-HQA (MemAgent style) from {input}: {len(positions)} questions, pool of "
            f"{len(memagent_pool(records).docs)} paragraphs, seed {cfg.seed}, shuffle seed "
            f"{cfg.shuffle_seed}")
    for n, path in zip(dict.fromkeys(cfg.num_docs), paths):
        size = path.stat().st_size / 1e6
        listed = (cfg.style == "memagent" and cfg.index_list_from is not None
                  and n >= cfg.index_list_from)
        kind = f", index list (evaluate with the ruler-hqa entry's pool: {input})" if listed else ""
        console.print(f"[green]wrote[/green] {path}: num_docs={n}, {size:.1f} MB{kind}")


def _check_pool_file(input: str, records: list[QARecord]) -> None:
    """Index-list files are read back with a ruler-hqa entry's `pool: INPUT`: the input must
    be a file whose pool `load_hotpotqa_pool` rebuilds (the official HotpotQA JSON)."""
    try:
        docs = load_hotpotqa_pool(input)
    except MemrlInputError:
        docs = None
    if docs != memagent_pool(records).docs:
        raise MemrlInputError(
            "index-list files need the official HotpotQA JSON as --input (its pool is what "
            "a ruler-hqa entry's pool reads back)", location="index_list_from"
        )


@prepare_app.command("memagent-parquet")
def prepare_memagent_parquet(
    input: Annotated[str, typer.Option("--input", "-i", help="HotpotQA source (any format).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="OUT.parquet.")],
    args: Keys = None,
) -> None:
    """MemAgent-style training/validation parquet (data_source, prompt, context, ability,
    reward_model, extra_info), built like `prepare ruler-hqa style=memagent`. Keys: num_docs,
    num_questions, seed, shuffle_seed, filter.* (docs/configuration.md)."""
    cfg = load_command_config(MemagentParquetPrepare, args)
    if output.suffix.lower() != ".parquet":
        raise MemrlInputError(f"must end in .parquet, got '{output}'", location="--output")
    check_output_file(output, location=f"--output {output}")
    records = load_hotpotqa(input)
    positions = _memagent_questions(records, cfg)
    rows = memagent_training_rows(records, cfg.num_docs, questions=positions, seed=cfg.seed,
                                  shuffle_seed=cfg.shuffle_seed)
    path = save_memagent_rows(rows, output)
    size = path.stat().st_size / 1e6
    console.print(f"[green]wrote[/green] {path}: {len(rows)} questions, "
                  f"num_docs={cfg.num_docs}, {size:.1f} MB")


@prepare_app.command("synthetic")
def prepare_synthetic(
    out: Annotated[Path, typer.Option("--out", "-o", help="OUT.jsonl or OUT.parquet.")],
    args: Keys = None,
) -> None:
    """Write deterministic two-hop questions over fictional entities (offline data). Keys:
    num_questions, num_docs, seed."""
    cfg = load_command_config(SyntheticPrepare, args)
    check_output_file(out, location=f"--out {out}")
    records = make_synthetic_records(cfg.num_questions, num_docs=cfg.num_docs, seed=cfg.seed)
    path = save_records(records, out)
    console.print(f"[green]wrote[/green] {path}: {_describe(records)}")


@prepare_app.command("biographies")
def prepare_biographies(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the files.")],
    args: Keys = None,
) -> None:
    """Write the biographies task (natural sentences, namesake distractors, held-out people
    and sentence forms): train.jsonl, val.jsonl and eval_{N}.json. Keys: split, num_docs,
    train_questions, train_docs, val_questions, eval_questions, hard_share, names, seed."""
    cfg = load_command_config(BiographiesPrepare, args)
    check_output_dir(out, location=f"--out {out}")
    paths = write_biographies(out, split=cfg.split, seed=cfg.seed,
                              train_questions=cfg.train_questions, train_docs=cfg.train_docs,
                              val_questions=cfg.val_questions,
                              eval_questions=cfg.eval_questions, eval_docs=cfg.num_docs,
                              hard_share=cfg.hard_share, names=cfg.names)
    print_written(paths)


def print_written(paths: list[Path]) -> None:
    """`wrote PATH (SIZE MB)` for each file a generator wrote."""
    for path in paths:
        console.print(f"[green]wrote[/green] {path} ({path.stat().st_size / 1e6:.1f} MB)")

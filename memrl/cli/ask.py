"""`memrl ask --model DIR --document FILE [FILE ...] --question "..."`: read, remember, answer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.agents.memagent import MemAgentConfig
from memrl.cli.app import app
from memrl.cli import common

AGENT_OPTIONS = ["chunk_size", "max_chunks", "max_memory_tokens", "max_final_tokens",
                 "temperature", "top_p", "seed", "prompts"]
"""The agent settings `ask` and `serve` take as options (over those stored with the model)."""
ASK_DEFAULTS = {"temperature": 0.0}
"""`memrl ask` answers greedily unless sampling is asked for: the same answer every run.
It runs on one torch thread unless --threads says otherwise: reading one document decodes
one token at a time, which a second thread does not speed up, and on a CPU busy with other
work each step waits for it (docs/lab/benchmarks.md, SmolLM2 MemAgent reading)."""


@app.command("ask")
@common.engine_options([*common.LOCAL, "base_url"], threads=1)
@common.config_options(MemAgentConfig, AGENT_OPTIONS, overrides=True)
def ask(
    model: common.ModelOption,
    document: Annotated[
        list[str],
        typer.Option("--document", help="Documents to read, in order: text, Markdown, HTML "
                     "or PDF files of any length; - reads standard input."),
    ],
    question: Annotated[str, typer.Option("--question", help="What to ask about them.")],
    config: dict[str, Any],
    serving: common.EngineChoice,
    show_memory: Annotated[
        bool, typer.Option("--show-memory", help="Print the memory after each chunk.")
    ] = False,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Write the episode to this JSONL file (open it with "
                     "`memrl view FILE`)."),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar and no summary.")] = False,
) -> None:
    """Read the documents chunk by chunk into a fixed-size memory and answer the question.

    Agent settings (chunk size, memory and answer lengths, prompts) are those stored with
    a model memrl trained, unless given here. Decoding is greedy (temperature 0: the same
    answer every run) unless --temperature (with --top-p, --seed) asks to sample. The
    answer goes to standard output; the progress bar and a summary of what was read to
    standard error (docs/ask.md)."""
    from memrl.apps.ask.api import check_question, document_chunks
    from memrl.apps.ask.documents import STDIN, open_document, spool_stdin
    from memrl.errors import MemrlInputError
    from memrl.inference.loader import load_tokenizer

    common.check_model_dir(model)
    question = check_question(question, "--question")
    if document.count(STDIN) > 1:
        raise MemrlInputError("standard input can be read once", location="--document -")
    docs = [open_document(spool_stdin(), name="standard input") if d == STDIN
            else open_document(Path(d)) for d in document]
    if trace is not None:
        from memrl.fileio import check_output_file

        check_output_file(trace, location=f"--trace {trace}")
    cfg = model_agent_config(model, {**ASK_DEFAULTS, **config}, "ask")
    chunks = document_chunks(load_tokenizer(model), docs, cfg)
    serving = common.reading_dtype(serving)
    generator = serving.load(model, seed=cfg.seed)
    result = run_with_progress(generator, chunks, question, cfg, show_memory=show_memory,
                               quiet=quiet)
    if trace is not None:
        import json

        from memrl.fileio import write_text_atomic

        write_text_atomic(trace, json.dumps(result.trace_row(), ensure_ascii=False) + "\n")
    typer.echo(result.text)
    if not quiet:
        print(summary(result, placement(generator))
              + (f"; trace in {trace}" if trace is not None else ""), file=sys.stderr)


def placement(generator: Any) -> str | None:
    """Where an in-process engine's model runs, e.g. "cpu, float32, 2 threads" (None for an
    engine in another process: vLLM, a server)."""
    import torch

    from memrl.inference.hf import HFEngine

    if not isinstance(generator, HFEngine):
        return None
    weight = next(generator.model.parameters())
    where = f"{weight.device.type}, {str(weight.dtype).removeprefix('torch.')}"
    if weight.device.type == "cpu":
        threads = torch.get_num_threads()
        where += f", {threads} thread{'s' if threads > 1 else ''}"
    return where


def summary(result: Any, where: str | None = None) -> str:
    """The line `memrl ask` ends with: what was read (of how much, when --max-chunks cut
    the documents), how fast (and `where`: device and dtype), the memory's largest size,
    the tokens processed."""
    read, total = result.document_tokens_read, result.context_tokens
    rate = read / result.elapsed_s if result.elapsed_s > 0 else 0.0
    longest = max((t.response_tokens for t in result.trajectory.turns[:-1]), default=0)
    docs = f"{len(result.documents)} document(s)"
    if result.capped:
        all_chunks = -(-total // result.config.chunk_size)
        what = (f"read {read:,} of {total:,} tokens of {docs} in {result.num_chunks:,} of "
                f"{all_chunks:,} chunks")
    else:
        what = f"read {total:,} tokens of {docs} in {result.num_chunks:,} chunks"
    on = f" on {where}" if where else ""
    return (f"{what} in {result.elapsed_s:.1f} s ({rate:,.0f} tokens/s{on}); memory at most "
            f"{longest:,} tokens; {result.usage.total_tokens:,} tokens processed")


def model_agent_config(model: Path, overrides: dict[str, Any], command: str
                       ) -> MemAgentConfig:
    """The agent settings stored with `model` (memrl.apps.ask.settings) under the options given;
    a warning when the model was trained as another agent."""
    from memrl.apps.ask.settings import agent_config, stored_settings

    stored = stored_settings(model)
    if stored.agent not in (None, "memagent"):
        common.print_warning(f"{model} was trained as a {stored.agent} agent; {command} reads "
                             "with MemAgent and its default settings")
    return agent_config(stored, overrides)


def run_with_progress(generator: Any, chunks: Any, question: str, config: MemAgentConfig, *,
                      show_memory: bool, quiet: bool) -> Any:
    """`memrl.apps.ask.api.read` under a progress bar on stderr (chunks read of all, document
    tokens/s, the memory's size), printing each memory on stdout when asked."""
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    from rich.progress import TimeElapsedColumn, TimeRemainingColumn

    from memrl.apps.ask.api import AskProgress, read
    from memrl.interrupt import exit_on_signals

    progress = Progress(
        TextColumn("chunks"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8,.0f} tokens/s"),
        TextColumn("memory {task.fields[memory]:>5,} tokens"),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=quiet, redirect_stdout=False,
        redirect_stderr=False,
    )
    task = progress.add_task("read", total=chunks.num_chunks, rate=0.0, memory=0)
    on_terminal = sys.stdout.isatty() and not quiet

    def on_progress(event: AskProgress) -> None:
        rate = event.document_tokens_read / event.elapsed_s if event.elapsed_s > 0 else 0.0
        progress.update(task, completed=event.chunks_read, rate=rate,
                        memory=event.memory_tokens)
        if show_memory and not event.done:
            text = (f"--- memory after chunk {event.chunks_read}/{event.num_chunks} "
                    f"({event.memory_tokens} tokens) ---\n{event.memory}")
            if on_terminal:
                progress.console.print(text, markup=False, highlight=False)
            else:
                print(text, flush=True)

    with exit_on_signals("while reading the documents", "nothing was saved; run it again"):
        with progress:
            return asyncio.run(read(generator, chunks, question, config, progress=on_progress))

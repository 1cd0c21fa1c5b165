"""`memrl ask --model DIR --document FILE [FILE ...] --question "..." [CONFIG] [key.path=value
...]`: read, remember, answer (the config: `memrl.recipes.reading.AskConfig`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.agents.memagent import MemAgentConfig
from memrl.cli.app import app
from memrl.cli import common

ASK_DEFAULTS = {"temperature": 0.0}
"""`memrl ask` answers greedily unless sampling is asked for (`memagent.temperature`, or
`rollout.temperature`): the same answer every run."""
CONFIG_HELP = ("A config (YAML), then dotted overrides key.path=value, e.g. "
               "memagent.chunk_size=512 rollout.engine=vllm (the keys: docs/configuration.md).")
CONFIG_METAVAR = "CONFIG KEY.PATH=VALUE"


@app.command("ask")
def ask(
    model: common.ModelOption,
    document: Annotated[
        list[str],
        typer.Option("--document", help="Documents to read, in order: text, Markdown, HTML "
                     "or PDF files of any length; - reads standard input."),
    ],
    question: Annotated[str, typer.Option("--question", help="What to ask about them.")],
    args: list[str] = typer.Argument(None, help=CONFIG_HELP, metavar=CONFIG_METAVAR),
) -> None:
    """Read the documents chunk by chunk into a fixed-size memory and answer the question.

    Every setting is a key (docs/configuration.md, `memrl ask`): the agent's `memagent.*`
    (chunk_size, max_chunks, max_memory_tokens, max_final_tokens, prompts, temperature,
    top_p), `model.dtype`, `model.device`, `seed`, the engine `rollout.*` (engine,
    openai.base_urls, vllm.*, generation_batch_size) and `ask.*` (show_memory, trace, quiet,
    threads). The agent settings are those stored with a model memrl trained, unless given.
    Decoding is greedy unless memagent.temperature (or rollout.temperature) asks to sample.
    The answer goes to standard output; the progress bar and a summary of what was read to
    standard error (docs/ask.md)."""
    from memrl.apps.ask.api import check_question, document_chunks
    from memrl.apps.ask.documents import STDIN, open_document, spool_stdin
    from memrl.apps.ask.settings import load_reading_config
    from memrl.errors import MemrlInputError
    from memrl.inference.loader import load_tokenizer
    from memrl.recipes.reading import AskConfig, reading_agent, reading_engine

    common.check_model_dir(model)
    question = check_question(question, "--question")
    cfg = load_reading_config(AskConfig, model, args, command="ask",
                              agent_defaults=ASK_DEFAULTS, warn=common.print_warning)
    if document.count(STDIN) > 1:
        raise MemrlInputError("standard input can be read once", location="--document -")
    docs = [open_document(spool_stdin(), name="standard input") if d == STDIN
            else open_document(Path(d)) for d in document]
    trace = Path(cfg.ask.trace) if cfg.ask.trace is not None else None
    if trace is not None:
        from memrl.fileio import check_output_file

        check_output_file(trace, location=f"ask.trace {trace}")
    agent = reading_agent(cfg)
    chunks = document_chunks(load_tokenizer(model), docs, agent)
    generator = reading_engine(cfg)
    result = run_with_progress(generator, chunks, question, agent,
                               show_memory=cfg.ask.show_memory, quiet=cfg.ask.quiet)
    if trace is not None:
        import json

        from memrl.fileio import write_text_atomic

        write_text_atomic(trace, json.dumps(result.trace_row(), ensure_ascii=False) + "\n")
    typer.echo(result.text)
    if not cfg.ask.quiet:
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
    """The line `memrl ask` ends with: what was read (of how much, when max_chunks cut
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

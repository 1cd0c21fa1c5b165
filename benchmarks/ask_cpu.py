"""`memrl ask` on 10K, 100K and 1M-token documents on a CPU, with the tiny model or `--model
DIR`: time linear in the document's length, peak memory flat.

Each size runs `memrl ask` as a fresh process (so its peak resident memory is its own, read
with `os.wait4`), on a text file of about the number of tokens asked for (counted with the
model's tokenizer): real prose by default, Python's own reference documentation
(`pydoc_data.topics`, ~110K tokens, on every Python), or `--text FILE`'s text, repeated to the
size asked; `--synthetic`: sentences of random words (a trained agent writes degenerate,
repetitive memories of them). Printed per size: document tokens, chunks, tokens
the model generated and memory tokens a chunk (from the run's `ask.trace`: a random model
stops at a random EOS, so memory updates vary in length, and decoding is a large part of the
time; the trace does not count forward passes, so prompt lookup's drafts kept per pass are
not shown), the whole command's
wall time, the reading time and document tokens/s that `memrl ask` reports (model loaded,
documents counted: the agent loop alone), the process's CPU time (user + system, from
`os.wait4`: far less sensitive than wall time to other programs on the same cores), and peak
RSS; then the ratios that the acceptance asks for: peak RSS of the largest run against the
smallest, and the cost per token (reading time, and marginal CPU time over the smallest run:
the start-up, a few CPU seconds, is paid once).

    python benchmarks/ask_cpu.py                         # 10K, 100K, 1M tokens (~10 min)
    python benchmarks/ask_cpu.py --sizes 10000 100000    # quicker
    python benchmarks/ask_cpu.py --model DIR --engine vllm --sizes 1000000   # on a GPU
    python benchmarks/ask_cpu.py --model DIR --sizes 10000 --chunk-size 512 \
        --max-memory-tokens 96 --set rollout.prompt_lookup_tokens=0   # prompt lookup off

The tiny model is built in --work (memrl init-tiny-model's defaults, seed 0) unless --model
is given. Its weights are random: the answers mean nothing, the costs are real.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"read ([\d,]+) tokens of \d+ document\(s\) in ([\d,]+) chunks in "
                     r"([\d.]+) s \(([\d,]+) tokens/s[^)]*\)")
WORDS = ("river city mountain born capital president album film writer singer university "
         "founded located between during after before team club war battle company married "
         "daughter father mother American British French German Italian Spanish").split()
NAMES = ("Alvarez", "Brightwater", "Okonkwo", "Lindqvist", "Marchetti", "Tanaka", "Zhou")


def reference_text() -> str:
    """Python's reference documentation as plain text (`pydoc_data.topics`: what `help()`
    shows for keywords and topics), present on every Python."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def write_text(path: Path, tokens: int, tokenizer, text: str) -> int:
    """`text` repeated (paragraph by paragraph) to about `tokens` tokens (at most one
    paragraph over); its token count."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    if not paragraphs:
        raise SystemExit("the text has no words")
    total = 0
    with path.open("w", encoding="utf-8") as f:
        while total < tokens:
            for paragraph in paragraphs:
                total += len(tokenizer.encode(paragraph + "\n\n", add_special_tokens=False))
                f.write(paragraph + "\n\n")
                if total >= tokens:
                    break
    return total


def write_document(path: Path, tokens: int, tokenizer, seed: int = 0) -> int:
    """A text file of random-word sentences of about `tokens` tokens (at most a few hundred
    over; the count of the document is what `memrl ask` reports)."""
    rng = random.Random(seed)
    total = 0
    with path.open("w", encoding="utf-8") as f:
        while total < tokens:
            lines = []
            for _ in range(4):
                words = [rng.choice(WORDS + list(NAMES)) for _ in range(rng.randint(8, 18))]
                lines.append(" ".join(words).capitalize() + f" in {rng.randint(1800, 2024)}.")
            block = "\n".join(lines) + "\n"
            total += len(tokenizer.encode(block, add_special_tokens=False))
            f.write(block)
    return total


def run_ask(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS in bytes, stderr) of one `memrl ask` process."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"memrl ask failed ({proc.returncode}): {text[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--model", type=Path, help="model directory (default: a tiny one)")
    parser.add_argument("--work", type=Path,
                        default=Path(tempfile.gettempdir()) / "memrl_ask_cpu")
    parser.add_argument("--chunk-size", type=int, default=5000)
    parser.add_argument("--max-memory-tokens", type=int, default=256)
    parser.add_argument("--max-final-tokens", type=int, default=64)
    parser.add_argument("--text", type=Path,
                        help="the document: this file's text, repeated to each size "
                        "(default: Python's reference documentation, pydoc_data.topics)")
    parser.add_argument("--synthetic", action="store_true",
                        help="the document: sentences of random words (the earlier default)")
    parser.add_argument("--question", default=None,
                        help="the question asked (default: one about the document)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more `memrl ask` settings, e.g. rollout.prompt_lookup_tokens=0")
    parser.add_argument("--engine", default="hf", help="memrl ask's rollout.engine (hf, vllm)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of the `memrl ask` process (model.threads, OMP_NUM_THREADS); "
                        "1 makes its CPU time the work done even when other programs share "
                        "the cores (no OpenMP spinning)")
    return parser.parse_args()


def write_doc(path: Path, size: int, tokenizer, text: str | None) -> None:
    """The document of `size` tokens: `text` repeated, or random-word sentences (None)."""
    if text is None:
        write_document(path, size, tokenizer)
    else:
        write_text(path, size, tokenizer, text)


def print_table(rows: list[tuple]) -> None:
    """The runs as a Markdown table, then the ratios of each larger run to the first."""
    print()
    print("| document tokens | chunks | generated tokens | wall time (s) | reading time (s) | "
          "document tokens/s | CPU time (s) | peak RSS (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tokens, chunks, generated, wall, read_s, rate, cpu, peak in rows:
        print(f"| {tokens:,} | {chunks:,} | {generated:,} | {wall:.1f} | {read_s:.1f} | "
              f"{rate:,.0f} | {cpu:.1f} | {peak / 2**20:,.0f} |")
    if len(rows) > 1:
        first = rows[0]
        for row in rows[1:]:
            marginal = (row[6] - first[6]) / (row[0] - first[0]) * 1000
            print(f"{row[0]:,} tokens: peak RSS / the {first[0]:,}-token run's "
                  f"{row[7] / first[7]:.3f} (acceptance: <= 1.10); reading time per token / "
                  f"the {first[0]:,}-token run's {(row[4] / row[0]) / (first[4] / first[0]):.2f}"
                  f"; marginal CPU {marginal:.3f} s per 1K tokens")


def main() -> None:
    args = parse_args()
    from transformers import AutoTokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        model = args.work / "tiny"
        if not (model / "config.json").exists():
            from memrl.models.tiny import build_tiny_model

            build_tiny_model(model, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    import transformers

    print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}; model {model}")
    text = None if args.synthetic else (
        args.text.read_text(encoding="utf-8") if args.text else reference_text())
    question = args.question or ("Who founded the university?" if args.synthetic else
                                 "What does the assert statement do when optimization is on?")
    rows = []
    for size in args.sizes:
        doc = args.work / f"doc_{size}.txt"
        write_doc(doc, size, tokenizer, text)
        trace = args.work / f"trace_{size}.jsonl"
        cmd = [sys.executable, "-m", "memrl", "ask", "--model", str(model), "--document",
               str(doc), "--question", question,
               f"memagent.chunk_size={args.chunk_size}",
               f"memagent.max_memory_tokens={args.max_memory_tokens}",
               f"memagent.max_final_tokens={args.max_final_tokens}", "seed=0",
               f"ask.trace={trace}", f"rollout.engine={args.engine}",
               *([f"model.threads={args.threads}"] if args.threads is not None else []),
               *args.set]
        print("$ memrl " + " ".join(cmd[3:]), flush=True)
        wall, cpu, peak, err = run_ask(cmd, env)
        match = SUMMARY.search(err)
        if match is None:
            raise SystemExit(f"no summary line in the output: {err[-1000:]}")
        tokens, chunks, read_s, rate = (float(g.replace(",", "")) for g in match.groups())
        episode = json.loads(trace.read_text())
        generated = episode["usage"]["completion_tokens"]
        memory = sum(episode["memory_tokens"]) / max(len(episode["memory_tokens"]), 1)
        rows.append((int(tokens), int(chunks), generated, wall, read_s, rate, cpu, peak))
        print(f"  {int(tokens):,} tokens, {int(chunks)} chunks, {generated:,} generated "
              f"({memory:.1f} memory tokens a chunk): "
              f"{wall:.1f} s wall, {read_s:.1f} s reading ({rate:,.0f} tokens/s), {cpu:.1f} "
              f"CPU s, peak RSS {peak / 2**20:,.0f} MiB", flush=True)
    print_table(rows)


if __name__ == "__main__":
    main()

"""RULER-HQA evaluation: MemAgent over HotpotQA questions buried in N distractor documents.

For every N in `num_docs_list` it reads `eval_{N}.json`, runs the agent (no learning),
scores each trajectory's extracted answer against the gold answers (EM, F1, sub-EM) and
writes into `out_dir`:

- `results.json`: per-N means + config + model + timings (rewritten after every N, so a
  long run that is interrupted keeps the finished lengths);
- `trajectories_{N}.jsonl`: every trajectory with its memories, final response and scores;
- `results.md`: the table below, as Markdown;
- `plot.png`: sub-EM and F1 (%) against mean context length (tokens, log scale).

Scores in results.json are fractions in [0, 1]; tables and plots show percentages. The
headline metric, as MemAgent reports it, is sub-EM x 100 (`score`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memrl.agents.memagent import MemAgentConfig, rich_progress_callback
from memrl.agents.trajectory import Trajectory
from memrl.data.ruler_hqa import load_ruler_hqa, ruler_hqa_path
from memrl.errors import MemrlInputError
from memrl.eval.report import (
    finish_header,
    plot_scores,
    progress_bars,
    run_header,
    write_json,
    write_jsonl,
    write_report,
)
from memrl.inference.base import Generator
from memrl.tasks.memagent_qa import MemAgentQATask

METRICS = ("em", "f1", "sub_em")
TABLE_COLUMNS = ("N", "context tokens", "chunks", "EM", "F1", "sub-EM")


def aggregate(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Means over all scored trajectories of one N (every sample counts once, as MemAgent)."""
    n = len(trajectories)
    if n == 0:
        return {"n": 0, **{m: None for m in METRICS}, "score": None, "context_tokens": None,
                "chunks": None, "capped": 0, "no_answer": 0}
    means = {m: sum(t.metrics[m] for t in trajectories) / n for m in METRICS}
    return {
        "n": n,
        **means,
        "score": 100.0 * means["sub_em"],
        "context_tokens": sum(t.info["context_tokens"] for t in trajectories) / n,
        "chunks": sum(t.info["num_chunks"] for t in trajectories) / n,
        "capped": sum(bool(t.info["capped"]) for t in trajectories),
        "no_answer": sum(t.answer is None for t in trajectories),
    }


def table_rows(per_n: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Rows of the results table: N, context tokens, chunks, EM, F1, sub-EM (in %)."""
    rows = []
    for key, r in per_n.items():
        pct = [None if r[m] is None else 100.0 * r[m] for m in METRICS]
        tokens = None if r["context_tokens"] is None else round(r["context_tokens"])
        rows.append([int(key), tokens, r["chunks"], *pct])
    return rows


def evaluate_ruler_hqa(
    generator: Generator,
    data_dir: str | Path,
    num_docs_list: Sequence[int],
    *,
    config: MemAgentConfig,
    out_dir: str | Path,
    limit: int | None = None,
    num_samples: int = 1,
    records_per_run: int | None = None,
    model_name: str | None = None,
    console: Any = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run MemAgent on RULER-HQA for each N and write results; returns the results dict.

    `limit` takes the first records of each file; `num_samples` trajectories per record;
    `records_per_run` is how many records run together in lockstep (None: all of an N at
    once; the generator splits big calls into its own micro-batches).
    """
    from rich.console import Console

    if not num_docs_list:
        raise MemrlInputError("give at least one number of documents", location="--num-docs")
    for option, value in (("--limit", limit), ("records_per_run", records_per_run)):
        if value is not None and value < 1:
            raise MemrlInputError(f"must be >= 1, got {value}", location=option)
    if num_samples < 1:
        raise MemrlInputError(f"must be >= 1, got {num_samples}", location="--samples")
    num_docs_list = list(dict.fromkeys(int(n) for n in num_docs_list))
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise MemrlInputError("RULER-HQA data directory not found", location=str(data_dir))
    for n in num_docs_list:  # fail before hours of generation, not in the middle
        if not ruler_hqa_path(data_dir, n).is_file():
            raise MemrlInputError(
                f"no RULER-HQA file for N={n} (build it with `memrl prepare ruler-hqa`)",
                location=str(ruler_hqa_path(data_dir, n)),
            )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    task = MemAgentQATask(config)
    started = time.perf_counter()
    results = run_header(
        "ruler_hqa", generator, model_name, config,
        data_dir=str(data_dir), num_docs=num_docs_list, limit=limit, num_samples=num_samples,
        records_per_run=records_per_run, metric="sub_em",
    )
    results.update(results={}, timings={"per_num_docs_s": {}, "total_s": 0.0})
    with progress_bars(console, show_progress) as progress:
        for n in num_docs_list:
            path = ruler_hqa_path(data_dir, n)
            records = load_ruler_hqa(path)[:limit]
            on_event = rich_progress_callback(progress, f"N={n}")
            t0 = time.perf_counter()
            trajectories: list[Trajectory] = []
            step = records_per_run or max(len(records), 1)
            for i in range(0, len(records), step):
                trajectories += task.rollout(
                    generator, records[i : i + step], num_samples=num_samples,
                    seed=config.seed, keep_token_ids=False, progress=on_event,
                )
            elapsed = time.perf_counter() - t0

            by_id = {r.id: r for r in records}
            write_jsonl(
                out / f"trajectories_{n}.jsonl",
                (task.log_row(t, by_id[t.record_id]) for t in trajectories),
            )
            results["results"][str(n)] = {"num_docs": n, "num_records": len(records),
                                          **aggregate(trajectories), "seconds": elapsed}
            results["timings"]["per_num_docs_s"][str(n)] = elapsed
            results["timings"]["total_s"] = time.perf_counter() - started
            write_json(out / "results.json", results)

    finish_header(results)
    results["timings"]["total_s"] = time.perf_counter() - started
    write_json(out / "results.json", results)

    title = f"RULER-HQA · {results['model']}"
    write_report(out, title, TABLE_COLUMNS, table_rows(results["results"]), console)
    _plot(out / "plot.png", results["results"], title)
    return results


def _plot(path: Path, per_n: dict[str, dict[str, Any]], title: str) -> None:
    keys = [k for k, r in per_n.items() if r["n"]]
    if not keys:
        return
    x = [max(per_n[k]["context_tokens"], 1.0) for k in keys]
    plot_scores(
        path,
        x,
        {"sub-EM": [100.0 * per_n[k]["sub_em"] for k in keys],
         "F1": [100.0 * per_n[k]["f1"] for k in keys]},
        xlabel="mean context length (tokens)",
        ylabel="score (%)",
        title=title,
        labels=[f"N={k}" for k in keys],
    )

"""Evaluation = agent x benchmark: a `Benchmark` gives its records by slice (a length: N
documents, or a named set: LoCoMo's conversations of a split), scores and aggregates the rows
any agent's task writes, and reports; the one runner (`memrl.eval.runner`) rolls the agent
out, resumes and spreads the work.

    bench = benchmark_of("where-now", data_dir, num_docs=[2, 8], limit=16)
    results = evaluate_benchmark(task, engine, bench, out_dir=..., header=...)

Benchmarks are named like agents: a key of `BENCHMARKS` or an import path
`package.module:attr`, `attr` being a callable `(name, data_dir, num_docs, limit)` that
returns a Benchmark. The registered ones all read RULER-HQA's `eval_{N}.json` files
(`RulerFormat`): RULER-HQA itself, the biographies and the state-tracking sets that
`memrl prepare ...` writes; `locomo` (`memrl.eval.locomo:LocomoBenchmark`) reads a
`memrl prepare locomo` directory, one slice a conversation split, for the memupdate agent.
A row is scored by the benchmark, not by the agent: the answer the task's log row holds
(`answer`) against the record's gold answers (`memrl.rewards.qa.qa_scores`), so every
agent is measured alike; the task's own scores stay in the row.

A run directory holds `trajectories_{slice}.jsonl`, `results.json` (per slice, every slice
ever run there), `results.md` and `plot.png` (score against N). `write_leaderboard` writes the
summary across benchmarks of a suite (`leaderboard.md` / `.json`, diffable between models).
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from memrl.errors import MemrlInputError
from memrl.eval.report import plot_scores, progress_bars, write_json, write_report
from memrl.eval.runner import EvalRun, check_counts, open_run, run_episodes

STATE_TRACKING = ("where-now", "where-before", "who-has", "counting", "knowledge-update")
"""The state-tracking sets (`memrl prepare where-now` ...): answers that change over the
document."""

BENCHMARKS: dict[str, str] = {"ruler-hqa": "memrl.eval.ruler_hqa:ruler_hqa_benchmark",
                              "biographies": "memrl.eval.benchmark:RulerFormat"} | {
    name: "memrl.eval.benchmark:StateTracking" for name in STATE_TRACKING} | {
    "locomo": "memrl.eval.locomo:LocomoBenchmark"}
"""Benchmark name -> "module:attr" of its factory (imported on first use)."""

HEADLINE: dict[str, str] = {"ruler-hqa": "sub_em", "biographies": "sub_em"}
"""The headline metric of a registered `RulerFormat` benchmark; the others (state tracking:
short answers) exact match, `em`."""

SliceKey = int | str
"""A slice of a benchmark: a length (N, documents per context) or the name of a set."""

METRICS = ("em", "f1", "sub_em")
REQUIRED = ("name", "metric", "slices", "records", "score", "aggregate", "report")
"""What a benchmark must have (`Benchmark` documents each)."""


class Benchmark(Protocol):
    """What the runner needs of a benchmark."""

    name: str
    """Its name (a key of `BENCHMARKS` or its import path); heads its report."""
    metric: str
    """The key of `score`'s result that is the benchmark's headline (a fraction)."""

    def slices(self) -> list[SliceKey]:
        """The slices to run, in order: lengths (N, documents per context) or named sets."""
        ...

    def records(self, key: SliceKey) -> list[Any]:
        """The records of one slice (each with a unique `.id`)."""
        ...

    def score(self, rows: list[dict[str, Any]], records: Mapping[str, Any]) -> None:
        """Add the benchmark's scores to log rows, in place (`records`: id -> record); the
        rows of one run of the runner come together, so a judge model can take them at
        once. The task's own scores stay in each row."""
        ...

    def aggregate(self, key: SliceKey, rows: Sequence[Mapping[str, Any]],
                  records: Sequence[Any]) -> dict[str, Any]:
        """The slice's results (with `score`, the headline in %, or None)."""
        ...

    def report(self, run: EvalRun, per_slice: dict[str, Any]) -> None:
        """results.md, the console table and the plot, from every slice's results."""
        ...


class MeasuresItsAgent(Protocol):
    """What a benchmark may add (optional, looked up once per run by `evaluate_suite`):
    a benchmark that measures one agent its own way (RULER-HQA under MemAgent's protocol,
    LoCoMo's memory store)."""

    records_per_run: int
    """Records rolled out together when the run does not say (`eval.records_per_run`)."""

    def adapt(self, task: Any) -> Any:
        """The task the benchmark runs: `task` as this benchmark measures it (a one-line
        error for an agent it cannot measure)."""
        ...

    def seed_key(self, key: SliceKey) -> tuple[Any, ...]:
        """What the seed of slice `key`'s records derives from besides (seed, ..., record
        index); default (the benchmark's name, key)."""
        ...


def benchmark_of(name: str, data_dir: str | Path, num_docs: Sequence[int] | None = None,
                 limit: int | None = None, **options: Any) -> Benchmark:
    """The benchmark `name` names (registered or `package.module:attr`) over `data_dir`;
    `options`: its own settings (pool, protocol, categories, split: `memrl.recipes.
    evaluate.BenchmarkEntry`)."""
    path = BENCHMARKS.get(name)
    if path is None and ":" not in name:
        raise MemrlInputError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}, "
                              "or an import path package.module:attr", location="eval.benchmarks")
    module_name, _, attr = (path or name).partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as exc:
        raise MemrlInputError(f"cannot import {module_name!r} for benchmark {name!r} ({exc})",
                              location="eval.benchmarks") from None
    if not callable(factory):
        raise MemrlInputError(f"{module_name} has no benchmark {attr!r}",
                              location="eval.benchmarks")
    bench = factory(name, data_dir, num_docs, limit, **options)
    missing = [m for m in REQUIRED if not hasattr(bench, m)]
    if missing:
        raise MemrlInputError(f"{name} is not a memrl Benchmark: it lacks {', '.join(missing)} "
                              "(see memrl.eval.benchmark.Benchmark)", location="eval.benchmarks")
    return bench


@dataclass
class RulerFormat:
    """A benchmark of `eval_{N}.json` files (RULER-HQA's format): one slice per N (default:
    every file in the directory), the first `limit` records of each; rows scored by
    EM / F1 / sub-EM of their `answer` against the record's answers."""

    name: str
    data_dir: str | Path
    num_docs: Sequence[int] | None = None
    limit: int | None = None
    pool: str | Path | None = None
    metric: str = ""

    def __post_init__(self) -> None:
        from memrl.eval.ruler_hqa import check_ruler_files

        check_counts(limit=self.limit)
        self.data_dir = Path(self.data_dir)
        self.metric = self.metric or HEADLINE.get(self.name, "em")
        if not self.num_docs and self.data_dir.is_dir():
            self.num_docs = sorted(int(p.stem.removeprefix("eval_"))
                                   for p in self.data_dir.glob("eval_*.json")
                                   if p.stem.removeprefix("eval_").isdigit())
        if not self.num_docs:
            raise MemrlInputError("no eval_{N}.json files here (build them with `memrl "
                                  f"prepare {self.name}`)", location=str(self.data_dir))
        self.num_docs = list(dict.fromkeys(int(n) for n in self.num_docs))
        prepare = self.name if self.name in BENCHMARKS else "ruler-hqa"
        check_ruler_files(self.data_dir, self.num_docs, self.pool, prepare)

    def slices(self) -> list[SliceKey]:
        return list(self.num_docs or ())

    def records(self, key: SliceKey) -> list[Any]:
        from memrl.data.ruler_hqa import load_ruler_hqa, ruler_hqa_path
        from memrl.eval.ruler_hqa import clean_record

        return [clean_record(r) for r in load_ruler_hqa(
            ruler_hqa_path(self.data_dir, key), pool=self._pool, expected_num_docs=key)
            [:self.limit]]

    @cached_property
    def _pool(self) -> Any:
        """The HotpotQA pool index-list files point into, shared by every N."""
        from memrl.data.ruler_hqa import LazyPool

        return None if self.pool is None else LazyPool(self.pool)

    def score(self, rows: list[dict[str, Any]], records: Mapping[str, Any]) -> None:
        """`benchmark_scores` of each row: EM / F1 / sub-EM of its `answer`."""
        from memrl.rewards.qa import qa_scores

        for row in rows:
            answer = row.get("answer")
            row["benchmark_scores"] = qa_scores(answer if isinstance(answer, str) else None,
                                                records[row["id"]].answers)

    def aggregate(self, key: SliceKey, rows: Sequence[Mapping[str, Any]],
                  records: Sequence[Any]) -> dict[str, Any]:
        return score_means(rows, self.metric, context_words=_mean_words(records))

    def report(self, run: EvalRun, per_slice: dict[str, Any]) -> None:
        report_slices(run, self.name, per_slice, self.metric)


@dataclass
class StateTracking(RulerFormat):
    """A state-tracking set: RulerFormat's scores, and `superseded`, the share of answers
    that name a state the document replaced (the generator's `superseded` of each question:
    an earlier place, holder, count or value) rather than the latest one: the mark of a memory
    that captured a fact and never overwrote it. Read from the `eval_{N}.json` files
    themselves (the loaded records keep only question, answers and context)."""

    _superseded: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)

    def records(self, key: SliceKey) -> list[Any]:
        from memrl.data.ruler_hqa import ruler_hqa_path

        items = json.loads(ruler_hqa_path(self.data_dir, key).read_text(encoding="utf-8"))
        self._superseded.update({str(item.get("index", i)): list(item.get("superseded") or [])
                                 for i, item in enumerate(items) if isinstance(item, dict)})
        return super().records(key)

    def score(self, rows: list[dict[str, Any]], records: Mapping[str, Any]) -> None:
        """RulerFormat's `benchmark_scores`, with `superseded`: 1.0 when the answer matches
        (EM after normalisation) one of the record's superseded states and no gold answer."""
        from memrl.rewards.qa import qa_scores

        super().score(rows, records)
        for row in rows:
            answer, old = row.get("answer"), self._superseded.get(str(row["id"])) or []
            stale = (isinstance(answer, str) and bool(old) and not row["benchmark_scores"]["em"]
                     and qa_scores(answer, old)["em"] == 1.0)
            row["benchmark_scores"]["superseded"] = float(stale)

    def aggregate(self, key: SliceKey, rows: Sequence[Mapping[str, Any]],
                  records: Sequence[Any]) -> dict[str, Any]:
        out = super().aggregate(key, rows, records)
        known = [r["benchmark_scores"]["superseded"] for r in rows
                 if "superseded" in r["benchmark_scores"]]
        return {**out, "superseded": sum(known) / len(known) if known else None}


def _mean_words(records: Sequence[Any]) -> float | None:
    return (sum(len(r.render_context().split()) for r in records) / len(records)
            if records else None)


def score_means(rows: Sequence[Mapping[str, Any]], metric: str,
                **extra: Any) -> dict[str, Any]:
    """`n`, the mean of each benchmark score (`METRICS`, from `row["benchmark_scores"]`), the
    headline `score` (`metric` in %) and `not_run`: rows the agent could not run (`fits`
    False: the long-context reader's over-long prompts); the score is None when any."""
    n = len(rows)
    means = {m: (sum(r["benchmark_scores"][m] for r in rows) / n if n else None)
             for m in METRICS}
    not_run = sum(r.get("fits") is False for r in rows)
    score = None if not n or not_run else 100.0 * means[metric]
    return {"n": n, **means, "score": score, "not_run": not_run, **extra}


COLUMNS = ("N", "context words", "episodes", "EM", "F1", "sub-EM", "score")


def report_slices(run: EvalRun, name: str, per_slice: Mapping[str, Any], metric: str) -> None:
    """results.md / the console table (scores in %; "does not fit" where the agent could
    not run a record) and plot.png (the headline score against N)."""
    rows = []
    for key in sorted(per_slice, key=int):
        r = per_slice[key]
        pct = [None if r[m] is None else 100.0 * r[m] for m in METRICS]
        words = None if r.get("context_words") is None else round(r["context_words"])
        head = [int(key), words, r["n"]]
        rows.append([*head, *pct, r["score"]] if not r["not_run"] else
                    [*head, "", "", "", f"does not fit ({r['not_run']} of {r['n']})"])
    agent = run.results.get("agent") or "agent"
    title = f"{name} · {agent} · {run.results['model']}"
    write_report(run.out, title, COLUMNS, rows, run.console,
                 f"\nScores of the answers against the gold, best over the gold answers; "
                 f"`score` is {metric} (%), none where a record did not fit.\n")
    keys = [k for k in sorted(per_slice, key=int) if per_slice[k]["score"] is not None]
    if keys:
        plot_scores(run.out / "plot.png", [int(k) for k in keys],
                    {metric: [per_slice[k]["score"] for k in keys]},
                    xlabel="N (documents per context)", ylabel="score (%)", title=title)


def evaluate_benchmark(
    task: Any, engine: Any, bench: Benchmark, *, out_dir: str | Path, header: dict[str, Any],
    num_samples: int = 1, per_run: int = 8, seed_of: Callable[[int, int], int | None],
    resume: bool = False, console: Any = None, show_progress: bool = True, dist: Any = None,
    progress_of: Callable[[Any, str], Any] | None = None,
) -> dict[str, Any]:
    """Roll `task` out on every slice of `bench` into `out_dir` and report; returns the
    results dict. Slices are run in order, each into `trajectories_{N}.jsonl` (finished
    episodes reused, `memrl.eval.runner.run_episodes`), the slice starting at record i
    seeded with `seed_of(N, i)`; results.json is rewritten after every slice and keeps the
    slices of earlier runs into the same directory. `progress_of(bars, label)`: the
    task's progress callback (None: one bar of records per slice)."""
    check_counts(samples=num_samples, records_per_run=per_run)
    run = open_run(out_dir, header, resume=resume, console=console, dist=dist)
    results, previous = run.results, run.previous
    per: dict[str, Any] = dict(previous.get("results") or {})
    timings = dict((previous.get("timings") or {}).get("per_num_docs_s") or {})
    if previous:
        results["num_docs"] = [slice_key(k) for k in sorted(
            {*per, *map(str, bench.slices())}, key=slice_order)]
    results.update(results=per, timings={"per_num_docs_s": timings, "total_s": 0.0})
    run.write()
    with progress_bars(run.console, show_progress and run.main) as bars:
        for n in bench.slices():
            records = bench.records(n)
            label = slice_label(n)
            rows, elapsed, resumed = run_episodes(
                task, engine, records, run.out / f"trajectories_{n}.jsonl",
                num_samples=num_samples, per_run=per_run, seed_of=lambda i, n=n: seed_of(n, i),
                console=run.console, label=f"{label}: ", dist=run.dist,
                **_progress(bench, records, bars, label, progress_of))
            timings[str(n)] = timings.get(str(n), 0.0) * resumed + elapsed
            per[str(n)] = {("slice" if isinstance(n, str) else "num_docs"): n,
                           "num_records": len(records), "num_samples": num_samples,
                           **bench.aggregate(n, rows, records), "seconds": timings[str(n)]}
            results["timings"]["total_s"] = time.perf_counter() - run.started
            run.write()
    results["results"] = per = dict(sorted(per.items(), key=lambda kv: slice_order(kv[0])))
    run.finish()
    if run.main:
        bench.report(run, per)
    return results


def slice_order(key: str) -> tuple[int, int, str]:
    """Sorts the keys of results.json's slices: lengths by N, then named sets by name."""
    return (0, int(key), "") if key.isdigit() else (1, 0, key)


def slice_key(key: str) -> SliceKey:
    """A slice's key as `Benchmark.slices` gives it, from its key in results.json."""
    return int(key) if key.isdigit() else key


def slice_label(key: SliceKey | str) -> str:
    """How reports and progress name a slice: `N=8` for a length, else its name."""
    return f"N={key}" if str(key).isdigit() else str(key)


def _progress(bench: Benchmark, records: Sequence[Any], bars: Any, label: str,
              progress_of: Callable[[Any, str], Any] | None) -> dict[str, Any]:
    """run_episodes' `progress` and `add_to_rows` for one slice: the benchmark's scores
    added to each row, and the task's progress callback or a bar of records."""
    by_id = {r.id: r for r in records}
    bar = None if progress_of is not None else bars.add_task(f"{label} records",
                                                             total=len(records))

    def add_to_rows(rows: list[dict[str, Any]]) -> None:
        bench.score(rows, by_id)
        if bar is not None:
            bars.advance(bar, len({r["id"] for r in rows}))

    return {"add_to_rows": add_to_rows,
            "progress": None if progress_of is None else progress_of(bars, label)}


def write_leaderboard(out_dir: str | Path, model: str, agent: str,
                      per_benchmark: Mapping[str, Mapping[str, Any]]) -> Path:
    """`leaderboard.md` and `leaderboard.json` in `out_dir`: the headline score (%) of each
    benchmark at each slice (N, or a named set) and its mean over the slices that ran, one
    row a benchmark (sorted keys, no timings or dates: two models' files diff line by
    line)."""
    from memrl.eval.report import markdown_table
    from memrl.eval.resume import encode_text
    from memrl.fileio import write_atomic

    lengths = sorted({n for r in per_benchmark.values() for n in r["results"]}, key=slice_order)
    board: dict[str, Any] = {"model": model, "agent": agent, "benchmarks": {}}
    rows = []
    for name in sorted(per_benchmark):
        res = per_benchmark[name]["results"]
        scores = {n: res[n]["score"] for n in lengths if n in res}
        ran = [s for s in scores.values() if s is not None]
        mean = sum(ran) / len(ran) if ran and len(ran) == len(scores) else None
        board["benchmarks"][name] = {"metric": per_benchmark[name].get("metric"),
                                     "scores": scores, "mean": mean}
        rows.append([name, per_benchmark[name].get("metric"),
                     *(scores.get(n, "") for n in lengths), mean])
    columns = ("benchmark", "metric", *map(slice_label, lengths), "mean")
    out = Path(out_dir)
    write_json(out / "leaderboard.json", board)
    text = (f"# Leaderboard · {agent} · {model}\n\n" + markdown_table(columns, rows)
            + "\nScores in %; `mean` over the slices of the row (none where one did not run).\n")
    write_atomic(out / "leaderboard.md", encode_text(text))
    return out / "leaderboard.md"


AGENTS: dict[str, str] = {"long-context": "memrl.eval.long_context:LongContextTask"}
"""Agents only evaluation has (besides `memrl.tasks.TASKS` and import paths): the
whole-document reader, a one-turn agent."""


def evaluate_suite(task: Any, engine: Any, benches: Mapping[str, Benchmark], *,
                   out_dir: str | Path, header: Callable[[Benchmark], dict[str, Any]],
                   seed: int | None, dist: Any = None, per_run: int | None = None,
                   **options: Any) -> dict[str, Any]:
    """`task` on every benchmark of `benches` (name -> Benchmark), each into
    `out_dir/<name>` (`evaluate_benchmark`; `header(bench)` its results.json header, with
    `model`, `agent` and `metric`; the slice at record i of N seeded from (seed, name, N,
    i)), then the leaderboard of them all in `out_dir` (`write_leaderboard`). A benchmark
    with `MeasuresItsAgent`'s abilities adapts the task, the seeds and `per_run` (None: its
    `records_per_run`, else 32). `options`: evaluate_benchmark's. Returns each benchmark's
    results."""
    from memrl.distributed import Dist
    from memrl.inference.base import derive_seed

    dist = dist or Dist()
    results = {}
    for name, bench in benches.items():
        head = header(bench)
        adapt = getattr(bench, "adapt", None)
        seed_key = getattr(bench, "seed_key", lambda n, name=name: (name, n))
        results[name] = evaluate_benchmark(
            adapt(task) if adapt is not None else task, engine, bench,
            out_dir=Path(out_dir) / name.replace(":", "_"), header=head,
            per_run=per_run or getattr(bench, "records_per_run", 32),
            seed_of=lambda n, i, key=seed_key: None if seed is None else derive_seed(
                seed, *key(n), i), dist=dist, **options)
    if dist.is_main and results:
        first = next(iter(results.values()))
        path = write_leaderboard(out_dir, first["model"], first.get("agent") or "", results)
        console = options.get("console")
        if console is not None:
            console.print(f"leaderboard: {path}")
    return results

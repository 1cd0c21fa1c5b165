"""RULER-HQA evaluation: MemAgent over HotpotQA questions buried in N distractor documents.

For every N in `num_docs_list` it reads `eval_{N}.json` (records whose `num_docs` is not N are
an error; index-list files need `pool`), runs the agent (no learning) through
`MemAgentQATask` with the chosen protocol (the task scores) and writes into `out_dir`:

- `trajectories_{N}.jsonl`: every episode with its memories, final response and scores,
  appended after every batch of `records_per_run` records;
- `results.json`: per-N means + config + model + protocol + timings, rewritten after every N
  and holding every N ever evaluated into this directory;
- `results.md`: the table of every N, as Markdown; `plot.png`: scores (%) against mean
  context length (tokens, log scale);
- `evidence_in_memory.json` / `.png`: the memory diagnostics of every N (whether the memory
  holds the gold answer and the supporting facts after each chunk, before and after the
  evidence was read, and its length; `memrl.eval.memory_trace`), computed from the
  trajectories files; their summary is also each N's `memory` in results.json.

Resumable and additive: running again into the same `out_dir` (same model, config and
protocol, else a one-line error) skips the episodes already in the trajectories files,
keyed by (record id, sample index) per N, and finishes the rest; a new N is added to the
results of the others. Batches are fixed slices of each file with a seed derived from
(seed, N, slice start), so a resumed run samples exactly what an uninterrupted one would.

Scores in results.json are fractions in [0, 1]; tables and plots show percentages. The
headline `score` is sub-EM x 100: one-way and best over all answers under
`memagent-boxed`; under `memagent` MemAgent's published number (bidirectional sub-EM on
answers[0], replies that are exactly empty dropped, rounded to 2 decimals), reported beside
the strict EM / one-way sub-EM and the count of empty predictions (docs/protocols.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.agents.memagent import MemAgentConfig, rich_progress_callback
from memrl.data.records import QARecord
from memrl.data.ruler_hqa import ruler_hqa_path
from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.eval.memory_trace import (
    aggregate_traces,
    read_diagnostics,
    summary_line,
    write_diagnostics,
)
from memrl.eval.benchmark import METRICS, RulerFormat, evaluate_benchmark
from memrl.eval.report import plot_scores, run_header, write_report
from memrl.eval.resume import replace_surrogates
from memrl.eval.runner import EvalRun, check_counts
from memrl.inference.base import Generator, derive_seed
from memrl.rewards.memagent import ProtocolScores, published_means
from memrl.tasks.memagent_qa import PROTOCOLS, MemAgentQATask

PROTOCOL_METRICS = ("strict_sub_em", "f1_unrounded")
DEFAULT_RECORDS_PER_RUN = 8
"""Records run together in lockstep, and appended to the trajectories file together: a kill
loses at most this many records' episodes."""

BOXED_COLUMNS = ("N", "context tokens", "chunks", "EM", "F1", "sub-EM")
PUBLISHED_COLUMNS = ("N", "context tokens", "chunks", "sub-EM (published)", "F1 (published)",
                     "EM", "strict sub-EM", "empty preds", "scored")


def table_columns(protocol: str) -> tuple[str, ...]:
    """The columns of the results table under `protocol`."""
    return PUBLISHED_COLUMNS if protocol == "memagent" else BOXED_COLUMNS


def _protocol_scores(row: Mapping[str, Any]) -> ProtocolScores:
    s = row["scores"]
    return ProtocolScores(
        prediction=row["answer"], gold=row["answers"][0], sub_em=s["sub_em"], em=s["em"],
        f1=s["f1"], f1_unrounded=s["f1_unrounded"], strict_sub_em=s["strict_sub_em"],
        prediction_empty=bool(s["prediction_empty"]), empty_credited=bool(s["empty_credited"]),
        dropped_by_published_mean=bool(s["dropped_by_published_mean"]),
    )


def aggregate(rows: Sequence[Mapping[str, Any]], protocol: str = PROTOCOLS[0]) -> dict[str, Any]:
    """Means over the episodes of one N (rows of a trajectories file; every sample counts
    once, as MemAgent). Under protocol `memagent` also `published` (MemAgent's printed
    percentages, `published_means`), the strict metrics and the empty-prediction counts."""
    n = len(rows)
    published = protocol == "memagent"
    if n == 0:
        empty: dict[str, Any] = {"n": 0, **{m: None for m in METRICS}, "score": None,
                                 "context_tokens": None, "chunks": None, "capped": 0,
                                 "no_answer": 0}
        if published:
            empty.update({m: None for m in PROTOCOL_METRICS}, published=None,
                         empty_predictions=0, empty_credited=0, dropped=0)
        return empty
    means = {m: sum(r["scores"][m] for r in rows) / n for m in METRICS}
    result: dict[str, Any] = {
        "n": n,
        **means,
        "score": 100.0 * means["sub_em"],
        "context_tokens": sum(r["context_tokens"] for r in rows) / n,
        "chunks": sum(r["num_chunks"] for r in rows) / n,
        "capped": sum(bool(r["capped"]) for r in rows),
        "no_answer": sum(r["answer"] is None for r in rows),
    }
    if published:
        scores = [_protocol_scores(r) for r in rows]
        result.update({m: sum(r["scores"][m] for r in rows) / n for m in PROTOCOL_METRICS})
        result["published"] = published_means(scores)
        result["score"] = result["published"]["sub_em"]
        result["empty_predictions"] = sum(s.prediction_empty for s in scores)
        result["empty_credited"] = sum(s.empty_credited for s in scores)
        result["dropped"] = sum(s.dropped_by_published_mean for s in scores)
    return result


def table_rows(per_n: Mapping[str, Mapping[str, Any]],
               protocol: str = PROTOCOLS[0]) -> list[list[Any]]:
    """Rows of the results table (scores in %), by increasing N; see `table_columns`."""
    rows = []
    for key in sorted(per_n, key=int):
        r = per_n[key]
        pct = lambda v: None if v is None else 100.0 * v  # noqa: E731
        tokens = None if r["context_tokens"] is None else round(r["context_tokens"])
        head = [int(key), tokens, r["chunks"]]
        if protocol == "memagent":
            pub = r["published"] or {}
            rows.append([*head, pub.get("sub_em"), pub.get("f1"), pct(r["em"]),
                         pct(r["strict_sub_em"]), r["empty_predictions"],
                         r["n"] - r["dropped"]])
        else:
            rows.append([*head, *(pct(r[m]) for m in METRICS)])
    return rows


def protocol_note(protocol: str) -> str:
    """The text under the results table saying which protocol produced it."""
    if protocol == "memagent":
        return (
            "\nProtocol `memagent` (MemAgent's published RULER-HQA evaluation): "
            "sub-EM (published) is the bidirectional sub-exact-match on answers[0] after "
            "`extract_answer_is`, F1 (published) HotpotQA F1 rounded per item to 2 decimals; "
            "both average over the `scored` episodes (replies that are exactly empty are "
            "dropped, as published). A prediction that normalises to the empty string scores "
            "1 in sub-EM (published): `empty preds` counts them; EM and strict sub-EM "
            "(one-way, non-empty) are the strict metrics. See docs/protocols.md.\n"
        )
    return (
        "\nProtocol `memagent-boxed` (the training format): last \\boxed{} of the reply; EM, "
        "F1 and one-way sub-EM, best over all gold answers. See docs/protocols.md.\n"
    )


def clean_record(record: QARecord) -> QARecord:
    """The record with lone surrogates replaced (tokenizers reject them)."""
    update = {"question": replace_surrogates(record.question),
              "answers": [replace_surrogates(a) for a in record.answers]}
    if record.context is not None:
        update["context"] = replace_surrogates(record.context)
    return record.model_copy(update=update)


def batch_seed(seed: int | None, num_docs: int, start: int) -> int | None:
    """The sampling seed of the batch of N=`num_docs` starting at record `start`."""
    return None if seed is None else derive_seed(seed, "ruler-hqa", num_docs, start)


@dataclass
class MemAgentRulerHQA(RulerFormat):
    """RULER-HQA as MemAgent's task measures it (`memrl eval` with `protocol` on its
    ruler-hqa entry): the task's own scores under `protocol` (MemAgent's published
    evaluation or the training format) and the memory diagnostics of every N (`memory`;
    earlier runs' read back from the run directory for the report)."""

    protocol: str = PROTOCOLS[0]
    memory: dict[str, Any] = field(default_factory=dict)
    records_per_run: int = DEFAULT_RECORDS_PER_RUN

    def adapt(self, task: Any) -> MemAgentQATask:
        """The memagent agent's task scoring under `protocol`, tracing the evidence."""
        if not isinstance(task, MemAgentQATask):
            raise MemrlInputError(f"protocol {self.protocol} scores the memagent agent, not "
                                  f"{task.name}", location="eval.benchmarks.protocol")
        return MemAgentQATask(task.config, task.weights, protocol=self.protocol,
                              trace_evidence=True)

    def seed_key(self, key: int) -> tuple[Any, ...]:
        return ("ruler-hqa", key)

    def score(self, rows: list[dict[str, Any]], records: Mapping[str, Any]) -> None:
        """Nothing added: the protocol scores the task's own answers (`aggregate`)."""

    def aggregate(self, key: int, rows: Sequence[Mapping[str, Any]],
                  records: Sequence[Any]) -> dict[str, Any]:
        self.memory[str(key)] = aggregate_traces(rows)
        return {**aggregate(rows, self.protocol), "memory": self.memory[str(key)]["summary"]}

    def report(self, run: EvalRun, per_slice: dict[str, Any]) -> None:
        report(run, per_slice, {**read_diagnostics(run.out), **self.memory}, self.protocol)


def ruler_hqa_benchmark(name: str, data_dir: str | Path, num_docs: Sequence[int] | None = None,
                        limit: int | None = None, pool: str | Path | None = None,
                        protocol: str | None = None) -> RulerFormat:
    """The `ruler-hqa` benchmark: any agent's answer scored by the benchmark (`RulerFormat`),
    or, with `protocol`, MemAgent's task's own scores (`MemAgentRulerHQA`)."""
    if protocol is None:
        return RulerFormat(name, data_dir, num_docs, limit, pool)
    if protocol not in PROTOCOLS:
        raise MemrlInputError(f"unknown protocol {protocol!r}; choose one of "
                              f"{', '.join(PROTOCOLS)}", location="eval.benchmarks.protocol")
    return MemAgentRulerHQA(name, data_dir, num_docs, limit, pool, protocol=protocol)


def evaluate_ruler_hqa(
    generator: Generator,
    data_dir: str | Path,
    num_docs_list: Sequence[int],
    *,
    config: MemAgentConfig,
    out_dir: str | Path,
    limit: int | None = None,
    num_samples: int = 1,
    records_per_run: int = DEFAULT_RECORDS_PER_RUN,
    protocol: str = PROTOCOLS[0],
    pool: str | Path | None = None,
    resume: bool = False,
    model_name: str | None = None,
    console: Any = None,
    show_progress: bool = True,
    dist: Dist | None = None,
) -> dict[str, Any]:
    """Run MemAgent on RULER-HQA for each N and write results; returns the results dict.

    `limit`: the first records of each file; `num_samples` trajectories per record,
    `records_per_run` records rolled out and saved together (`memrl.eval.runner`);
    `protocol`: `memrl.tasks.memagent_qa.PROTOCOLS`; `pool`: the HotpotQA dev JSON that
    index-list files (N = 12,800 / 25,600) point into. Finished episodes in `out_dir` are
    reused; `resume=True` requires that there are some. `dist`: the ranks of a data-parallel
    evaluation (`memrl.eval.runner`). The loop is `memrl.eval.benchmark.evaluate_benchmark`'s,
    with MemAgent's task, scores and memory diagnostics (`MemAgentRulerHQA`)."""
    check_counts(limit=limit, records_per_run=records_per_run, samples=num_samples)
    if not num_docs_list:
        raise MemrlInputError("give at least one number of documents", location="eval.num_docs")
    task = MemAgentQATask(config, protocol=protocol, trace_evidence=True)
    num_docs_list = list(dict.fromkeys(int(n) for n in num_docs_list))
    data_dir = Path(data_dir)
    bench = MemAgentRulerHQA("ruler-hqa", data_dir, num_docs_list, limit, pool,
                             protocol=protocol)
    header = run_header(
        "ruler_hqa", generator, model_name, config, protocol=protocol,
        data_dir=str(data_dir), num_docs=num_docs_list, limit=limit, num_samples=num_samples,
        records_per_run=records_per_run, metric="sub_em")
    return evaluate_benchmark(
        task, generator, bench, out_dir=out_dir, header=header, num_samples=num_samples,
        per_run=records_per_run, seed_of=lambda n, i: batch_seed(config.seed, n, i),
        resume=resume, console=console, show_progress=show_progress, dist=dist,
        progress_of=rich_progress_callback)


def check_ruler_files(data_dir: Path, num_docs_list: Sequence[int],
                      pool: str | Path | None, benchmark: str = "ruler-hqa") -> None:
    """Fail before hours of generation, not in the middle: the data directory, every
    `eval_{N}.json` and the pool file must exist."""
    if not data_dir.is_dir():
        raise MemrlInputError(f"{benchmark} data directory not found", location=str(data_dir))
    for n in num_docs_list:
        if not ruler_hqa_path(data_dir, n).is_file():
            raise MemrlInputError(
                f"no eval_{n}.json here for N={n} (build it with `memrl prepare {benchmark}`)",
                location=str(ruler_hqa_path(data_dir, n)),
            )
    if pool is not None and not Path(pool).is_file():
        raise MemrlInputError("HotpotQA pool file not found", location=f"pool {pool}")


def report(run: EvalRun, per_n: dict[str, Any], memory: dict[str, Any], protocol: str) -> None:
    """results.md and the console table, plot.png, the memory diagnostics."""
    title = f"RULER-HQA · {run.results['model']} · protocol {protocol}"
    write_report(run.out, title, table_columns(protocol), table_rows(per_n, protocol),
                 run.console, protocol_note(protocol))
    _plot(run.out / "plot.png", per_n, title, protocol)
    write_diagnostics(run.out, memory, title)
    for key in sorted(memory, key=int):
        run.console.print(summary_line(key, memory[key]), soft_wrap=True)


def _plot(path: Path, per_n: dict[str, dict[str, Any]], title: str, protocol: str) -> None:
    keys = [k for k, r in per_n.items() if r["n"]]
    if not keys:
        return
    x = [max(per_n[k]["context_tokens"], 1.0) for k in keys]
    if protocol == "memagent":
        series = {"sub-EM (published)": [per_n[k]["published"]["sub_em"] for k in keys],
                  "strict sub-EM": [100.0 * per_n[k]["strict_sub_em"] for k in keys],
                  "F1 (published)": [per_n[k]["published"]["f1"] for k in keys]}
    else:
        series = {"sub-EM": [100.0 * per_n[k]["sub_em"] for k in keys],
                  "F1": [100.0 * per_n[k]["f1"] for k in keys]}
    plot_scores(
        path,
        x,
        series,
        xlabel="mean context length (tokens)",
        ylabel="score (%)",
        title=title,
        labels=[f"N={k}" for k in keys],
    )

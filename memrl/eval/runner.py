"""The one evaluation runner: what every benchmark shares, for any task.

    run = open_run(out, header, resume=...)          # claim the directory (same model,
                                                      # config, protocol, or a one-line error)
    rows = run_episodes(task, engine, records, run.out / "trajectories.jsonl", ...)
                                                      # skip finished episodes, roll out the
                                                      # rest in slices, append their log rows
    run.finish(results)                               # results.json, with timings

A benchmark keeps only its setup (which records, which task settings), its aggregation of
the rows and its report; `evaluate_task` is the benchmark of a task that has none of its
own (`memrl eval agent=NAME eval.data=FILE`): the means of each row's reward and scores.

A log row (`Task.log_row`) has at least `id`, `sample_index`, `reward` and `scores` (a
mapping of numbers). Episodes are keyed by (id, sample index); slices are fixed, and each is
seeded from its start, so a resumed run samples exactly what an uninterrupted one would.

Data parallel (`memrl eval ... eval.data_parallel=N`, or the command under torchrun): every
rank runs the same benchmark code with an engine of its own (one GPU each on CUDA); the
main rank claims the directory and writes results.json and the reports; the slices still to
run are dealt out in rounds (one a rank), and after each round the main rank gathers the
rows and appends them, so the file has one writer and the results are those of one process
with the same seeds. A round waits for its slowest slice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.eval.report import finish_header, progress_bars, write_json, write_report
from memrl.eval.resume import append_episodes, check_same_run, read_episodes

TRAJECTORIES_FILE = "trajectories.jsonl"


@dataclass
class EvalRun:
    """A claimed run directory and the results.json being built in it."""

    out: Path
    results: dict[str, Any]
    previous: dict[str, Any] = field(default_factory=dict)
    console: Any = None
    started: float = field(default_factory=time.perf_counter)
    dist: Dist = field(default_factory=Dist)
    """The ranks of a data-parallel evaluation (one process: `Dist()`)."""

    @property
    def main(self) -> bool:
        """Whether this process writes results.json and the reports (rank 0)."""
        return self.dist.is_main

    def write(self) -> None:
        if self.main:
            write_json(self.out / "results.json", self.results)

    def finish(self) -> None:
        """Stamp the end time and total seconds; write results.json."""
        finish_header(self.results)
        timings = self.results.setdefault("timings", {})
        timings["total_s"] = time.perf_counter() - self.started
        self.write()


def open_run(out_dir: str | Path, header: dict[str, Any], *, resume: bool = False,
             console: Any = None, dist: Dist | None = None) -> EvalRun:
    """Claim `out_dir` for the run `header` describes (`memrl.eval.report.run_header`):
    a directory of another benchmark, model, protocol or config is a one-line error;
    `resume` requires a previous run there. results.json is written before any episode (by
    the main rank; the others read what it found there once it has)."""
    from rich.console import Console

    dist = dist or Dist()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise MemrlInputError("exists and is not a directory", location=f"--out {out}")
    claim: dict[str, Any] = {}
    if dist.is_main:  # the main rank's view, before it writes; every rank fails alike
        try:
            claim["previous"] = check_same_run(out / "results.json", header)
        except MemrlInputError as exc:
            claim["error"] = (exc.message, exc.location)
    claim = dist.all_gather(claim)[0]
    if "error" in claim:
        raise MemrlInputError(claim["error"][0], location=claim["error"][1])
    previous = claim["previous"]
    if resume and not previous:
        raise MemrlInputError("nothing to resume: no results.json here", location=f"--out {out}")
    if previous:
        header["started_at"] = previous.get("started_at", header["started_at"])
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
    console = (console or Console()) if dist.is_main else Console(quiet=True)
    run = EvalRun(out, header, previous, console, dist=dist)
    run.write()
    dist.barrier()
    return run


COUNT_KEYS = {"limit": "eval.limit", "samples": "rollout.n",
              "records_per_run": "eval.records_per_run",
              "episodes_per_run": "eval.records_per_run"}
"""The config key (`memrl.recipes.evaluate.EvalConfig`) of each count `check_counts` checks."""


def check_counts(**options: int | None) -> None:
    """Each count (a key of `COUNT_KEYS`) is None or >= 1."""
    for name, value in options.items():
        if value is not None and value < 1:
            raise MemrlInputError(f"must be >= 1, got {value}",
                                  location=COUNT_KEYS.get(name, name))


def run_episodes(
    task: Any,
    engine: Any,
    records: Sequence[Any],
    path: Path,
    *,
    num_samples: int,
    per_run: int,
    seed_of: Callable[[int], int | None],
    progress: Callable[[Any], None] | None = None,
    add_to_rows: Callable[[list[dict[str, Any]]], None] | None = None,
    console: Any = None,
    label: str = "",
    dist: Dist | None = None,
) -> tuple[list[dict[str, Any]], float, bool]:
    """Every (record, sample) episode's log row, in that order: those already in `path`,
    and the others rolled out `per_run` records at a time (the slice starting at record i
    seeded with `seed_of(i)`, no token ids kept) and appended to `path` after each slice.
    `add_to_rows` may add fields to a slice's rows before they are written. Returns the
    rows, the seconds spent rolling out, and whether any episode was already there.
    With `dist` of several ranks the unfinished slices are dealt out in rounds, one slice
    per rank a round; the main rank gathers each round's rows and alone reads and appends
    `path`; every rank returns all the rows (no directory shared between machines needed)."""
    dist = dist or Dist()
    # the main rank's reading (a torn last line of a killed run dropped), on every rank
    finished = read_episodes(path) if dist.is_main else {}
    if dist.world_size > 1:
        finished = dist.all_gather(finished)[0]
    wanted = [(r.id, s) for r in records for s in range(num_samples)]
    todo = sum(key not in finished for key in wanted)
    if todo < len(wanted) and console is not None:
        console.print(f"{label}{len(wanted) - todo} of {len(wanted)} episodes already in "
                      f"{path.name}, running the other {todo}", soft_wrap=True)
    t0 = time.perf_counter()
    # the slices with an episode to run (fixed starts, so a slice's seed never changes)
    starts = [i for i in range(0, len(records), per_run)
              if any((r.id, s) not in finished for r in records[i : i + per_run]
                     for s in range(num_samples))]
    if 0 < len(starts) < dist.world_size and console is not None:
        idle = dist.world_size - len(starts)
        console.print(f"{label}{len(starts)} slice(s) of up to {per_run} records to run on "
                      f"{dist.world_size} processes: {idle} of them "
                      f"{'has' if idle == 1 else 'have'} nothing to do (a smaller slice "
                      "spreads the work: eval.records_per_run)",
                      soft_wrap=True)
    for first in range(0, len(starts), dist.world_size):  # a round: a slice per rank
        mine = starts[first + dist.rank] if first + dist.rank < len(starts) else None
        rows: list[dict[str, Any]] = []
        if mine is not None:
            batch = [r for r in records[mine : mine + per_run]
                     if any((r.id, s) not in finished for s in range(num_samples))]
            trajectories = task.rollout(engine, batch, num_samples=num_samples,
                                        seed=seed_of(mine), keep_token_ids=False,
                                        progress=progress)
            by_id = {r.id: r for r in batch}
            rows = [task.log_row(t, by_id[t.record_id]) for t in trajectories
                    if (t.record_id, t.sample_index) not in finished]
            if add_to_rows is not None:
                add_to_rows(rows)
        if dist.world_size > 1:  # the round's rows, in slice order, on every rank
            rows = [row for part in dist.all_gather(rows) for row in part]
        if dist.is_main:
            append_episodes(path, rows)
        finished.update(((row["id"], row["sample_index"]), row) for row in rows)
    elapsed = max(dist.all_gather(time.perf_counter() - t0))
    return [finished[key] for key in wanted], elapsed, todo < len(wanted)


def mean_scores(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`n`, the mean `reward` and the mean of every numeric score of the rows."""
    out: dict[str, Any] = {"n": len(rows)}
    rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), int | float)]
    out["reward"] = sum(rewards) / len(rewards) if rewards else None
    keys = dict.fromkeys(k for r in rows for k in (r.get("scores") or {}))
    for key in keys:
        values = [r["scores"][key] for r in rows if isinstance((r.get("scores") or {}).get(key),
                                                               int | float)]
        out[key] = sum(values) / len(values) if values else None
    return out


def evaluate_task(task: Any, engine: Any, records: Sequence[Any], *, out_dir: str | Path,
                  header: dict[str, Any], num_samples: int = 1, per_run: int = 32,
                  seed: int | None = None, resume: bool = False, console: Any = None,
                  show_progress: bool = True, dist: Dist | None = None) -> dict[str, Any]:
    """Any task on `records`: trajectories.jsonl, and results.json / results.md with the
    means of the rows' reward and scores (`mean_scores`)."""
    from memrl.inference.base import derive_seed

    check_counts(samples=num_samples, episodes_per_run=per_run)
    run = open_run(out_dir, header, resume=resume, console=console, dist=dist)
    with progress_bars(run.console, show_progress and run.main) as bars:
        bar = bars.add_task(f"{task.name} episodes", total=len(records))
        rows, seconds, _ = run_episodes(
            task, engine, records, run.out / TRAJECTORIES_FILE, num_samples=num_samples,
            per_run=per_run, seed_of=lambda i: None if seed is None else derive_seed(
                seed, "eval", task.name, i),
            console=run.console, dist=run.dist,
            add_to_rows=lambda rows: bars.advance(bar, len({r["id"] for r in rows})))
    means = mean_scores(rows)
    run.results.update(results=means, timings={"rollout_s": seconds})
    run.finish()
    if not run.main:
        return run.results
    table = [[key, value] for key, value in means.items()]
    write_report(run.out, f"{task.name} · {run.results['model']}", ("metric", "mean"), table,
                 run.console, f"\nMeans over {len(rows)} episodes ({len(records)} records x "
                 f"{num_samples} samples).\n")
    return run.results

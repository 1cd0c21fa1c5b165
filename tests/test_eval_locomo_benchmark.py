"""LoCoMo behind the Benchmark seam: `locomo` is registered, its slice is a conversation
split (not a length), a suite runs the memupdate agent on it and writes the leaderboard,
another agent's rows are a one-line error; MemoryUpdate reports ProgressEvents."""

from __future__ import annotations

import json

import pytest

from memrl.agents.memupdate import MemUpdateConfig
from memrl.errors import MemrlInputError
from memrl.eval.benchmark import BENCHMARKS, benchmark_of, evaluate_suite
from memrl.eval.report import read_jsonl, run_header
from memrl.memory.embedder import HashingEmbedder
from memrl.tasks import ProgressEvent
from memrl.tasks.memupdate_locomo import MemoryUpdateTask
from tests.test_eval_locomo import data_dir  # noqa: F401  (the fixture)
from tests.test_eval_locomo_literature import agent as inserter  # stores the evidence line


def quiet():
    from rich.console import Console

    return Console(quiet=True)


def test_locomo_is_a_benchmark_with_a_named_slice(data_dir):  # noqa: F811
    bench = benchmark_of("locomo", data_dir)
    assert "locomo" in BENCHMARKS and bench.slices() == ["all"] and bench.metric == "f1_final"
    assert [e.category for e in bench.records("all")] == [1, 1, 2]  # categories 1-4
    with pytest.raises(MemrlInputError, match="no episodes of categories 1, 2, 3, 4 in split"):
        bench.records("heldout")
    with pytest.raises(MemrlInputError, match="LoCoMo data not found"):
        benchmark_of("locomo", data_dir / "missing")


def test_a_suite_runs_the_memupdate_agent_on_locomo(data_dir, tiny_tokenizer,  # noqa: F811
                                                    tmp_path):
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"), embedder=HashingEmbedder())
    engine = inserter(tiny_tokenizer)
    benches = {"locomo": benchmark_of("locomo", data_dir)}
    results = evaluate_suite(
        task, engine, benches, out_dir=tmp_path / "out", seed=0, show_progress=False,
        console=quiet(), header=lambda b: run_header(b.name, engine, "scripted", task.config,
                                                     agent="memupdate", metric=b.metric))
    per = results["locomo"]["results"]["all"]
    assert (per["slice"], per["num_records"], per["score"]) == ("all", 3, 100.0)
    assert set(per["categories"]) == {"1", "2", "all"}
    assert per["categories"]["1"]["f1_initial"] == 0.0
    rows = read_jsonl(tmp_path / "out" / "locomo" / "trajectories_all.jsonl")
    assert [r["literature"]["judge"] for r in rows] == [None] * 3
    board = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    assert board["benchmarks"]["locomo"] == {"metric": "f1_final", "scores": {"all": 100.0},
                                             "mean": 100.0}
    board_md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "| benchmark | metric | all | mean |" in board_md
    assert "1 multi-hop" in (tmp_path / "out" / "locomo" / "results.md").read_text()


def test_another_agents_rows_are_a_one_line_error(data_dir):  # noqa: F811
    bench = benchmark_of("locomo", data_dir)
    records = {e.id: e for e in bench.records("all")}
    rows = [{"id": next(iter(records)), "sample_index": 0, "answer": "4417"}]
    with pytest.raises(MemrlInputError, match="run it with agent=memupdate"):
        bench.score(rows, records)
    with pytest.raises(MemrlInputError, match="scores the memupdate agent .*, not long_context"):
        from memrl.eval.long_context import LongContextConfig, LongContextTask

        bench.adapt(LongContextTask(LongContextConfig()))


def test_memory_update_reports_progress_events(data_dir, tiny_tokenizer):  # noqa: F811
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"), embedder=HashingEmbedder())
    records = task.load(str(data_dir), "locomo", what="evaluation")[:2]
    events: list[ProgressEvent] = []
    trajectories = task.rollout(inserter(tiny_tokenizer), records, num_samples=2, seed=0,
                                progress=events.append)
    assert [(e.kind, e.episodes) for e in events] == [("start", 4)] + [("final", 1)] * 4
    assert [e.turn for e in events[1:]] == [t.turns[-1] for t in trajectories]

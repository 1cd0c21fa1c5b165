"""Evaluation = agent x benchmark (memrl.eval.benchmark): a benchmark's scores and
leaderboard by hand, any task on any benchmark through the one runner (resumed exactly),
the long-context reader as a one-turn agent, and `memrl eval ... eval.benchmarks=[...]`: MEM1
(examples/mem1, by import path) on RULER-HQA, and a suite of two benchmarks x two lengths
with its leaderboard, on the tiny model."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from memrl.config import load_config
from memrl.errors import MemrlInputError
from memrl.eval.benchmark import (
    RulerFormat,
    benchmark_of,
    evaluate_benchmark,
    evaluate_suite,
    score_means,
    write_leaderboard,
)
from memrl.eval.long_context import LongContextConfig, LongContextTask
from memrl.eval.report import run_header
from memrl.recipes.evaluate import EvalConfig, benchmarks_of
from memrl.inference.scripted import ScriptedGenerator
from test_eval_ruler_hqa import GOLD, write_ruler_dir
from test_plugin_agent import TASK, memrl


def quiet():
    return Console(file=io.StringIO(), width=200)


def row(answer_scores, fits=None):
    out = {"id": "x", "sample_index": 0, "benchmark_scores": answer_scores}
    return out if fits is None else {**out, "fits": fits}


def test_score_means_hand_computed():
    rows = [row({"em": 1.0, "f1": 1.0, "sub_em": 1.0}),
            row({"em": 0.0, "f1": 0.5, "sub_em": 1.0}),
            row({"em": 0.0, "f1": 0.0, "sub_em": 0.0})]
    means = score_means(rows, "sub_em", context_words=12.0)
    assert means == {"n": 3, "em": pytest.approx(1 / 3), "f1": pytest.approx(0.5),
                     "sub_em": pytest.approx(2 / 3), "score": pytest.approx(200 / 3),
                     "not_run": 0, "context_words": 12.0}
    # a record the agent could not run: counted, and no headline score
    means = score_means([*rows, row({"em": 0.0, "f1": 0.0, "sub_em": 0.0}, fits=False)], "em")
    assert means["not_run"] == 1 and means["score"] is None and means["em"] == 0.25
    assert score_means([], "em")["score"] is None


def test_leaderboard_is_sorted_dateless_and_hand_computed(tmp_path):
    per = {"where-now": {"metric": "em", "results": {"2": {"score": 50.0},
                                                     "8": {"score": 25.0}}},
           "ruler-hqa": {"metric": "sub_em", "results": {"2": {"score": 100.0},
                                                         "8": {"score": None}}}}
    path = write_leaderboard(tmp_path, "m", "memagent", per)
    board = json.loads((tmp_path / "leaderboard.json").read_text())
    assert list(board["benchmarks"]) == ["ruler-hqa", "where-now"]
    assert board["benchmarks"]["where-now"] == {"metric": "em", "scores": {"2": 50.0,
                                                                          "8": 25.0},
                                                "mean": 37.5}
    assert board["benchmarks"]["ruler-hqa"]["mean"] is None  # N=8 did not fit
    text = path.read_text()
    assert "| benchmark | metric | N=2 | N=8 | mean |" in text
    assert "| ruler-hqa | sub_em | 100.0 | - | - |" in text
    assert "| where-now | em | 50.0 | 25.0 | 37.5 |" in text
    assert not re.search(r"20\d\d-\d\d", text)  # no dates: two models' files diff


def test_unknown_benchmarks_and_missing_files_are_one_line(tmp_path):
    with pytest.raises(MemrlInputError, match="unknown benchmark 'nope'"):
        benchmark_of("nope", tmp_path)
    with pytest.raises(MemrlInputError, match="cannot import 'no_such_module'"):
        benchmark_of("no_such_module:bench", tmp_path)
    with pytest.raises(MemrlInputError, match="itertools:chain is not a memrl Benchmark: it lacks name"):
        benchmark_of("itertools:chain", tmp_path)  # a callable, but no benchmark
    with pytest.raises(MemrlInputError, match="no eval_{N}.json files here"):
        benchmark_of("where-now", tmp_path)
    write_ruler_dir(tmp_path, [2])
    with pytest.raises(MemrlInputError, match="no eval_4.json here for N=4"):
        benchmark_of("ruler-hqa", tmp_path, [2, 4])
    assert benchmark_of("ruler-hqa", tmp_path).slices() == [2]  # default: every file


def reader(tokenizer, right=True):
    """The long-context reader's oracle: \\boxed{gold} (or a wrong answer)."""

    def respond(prompt: str) -> str:
        question = re.search(r"<problem> \n(.*)\n</problem>", prompt).group(1)
        return f"\\boxed{{{GOLD[question] if right else 'nobody'}}}"

    return ScriptedGenerator(tokenizer, respond)


def run(task, engine, bench, out, **kw):
    header = run_header(bench.name, engine, "scripted", task.config, agent="long-context",
                        metric=bench.metric)
    return evaluate_benchmark(task, engine, bench, out_dir=out, header=header,
                              seed_of=lambda n, i: 0, console=quiet(),
                              show_progress=False, **kw)


def test_any_task_on_a_benchmark_scored_by_the_benchmark_and_resumed(tiny_tokenizer,
                                                                      tmp_path):
    data = write_ruler_dir(tmp_path / "data", [2, 4])
    task = LongContextTask(LongContextConfig(window=4096, max_new_tokens=16))
    bench = RulerFormat("ruler-hqa", data, [2, 4])
    results = run(task, reader(tiny_tokenizer), bench, tmp_path / "out", per_run=2)
    for n in ("2", "4"):
        r = results["results"][n]
        assert (r["n"], r["num_records"], r["score"], r["em"], r["not_run"]) == (3, 3, 100.0,
                                                                                 1.0, 0)
    rows = [json.loads(x) for x in (tmp_path / "out" / "trajectories_4.jsonl").open()]
    assert [r["benchmark_scores"]["em"] for r in rows] == [1.0, 1.0, 1.0]
    assert (tmp_path / "out" / "plot.png").is_file()
    assert "| 4 |" in (tmp_path / "out" / "results.md").read_text()
    # again into the same directory: every episode is read back, nothing generated
    engine = reader(tiny_tokenizer, right=False)
    again = run(task, engine, bench, tmp_path / "out", per_run=2, resume=True)
    assert engine.calls == [] and again["results"]["4"]["score"] == 100.0


def test_the_long_context_reader_does_not_truncate(tiny_tokenizer, tmp_path):
    data = write_ruler_dir(tmp_path / "data", [2, 4], words_per_doc=40)  # ~310 and ~720 tokens
    task = LongContextTask(LongContextConfig(window=500, max_new_tokens=16))
    engine = reader(tiny_tokenizer)
    results = run(task, engine, RulerFormat("ruler-hqa", data), tmp_path / "out")
    small, large = results["results"]["2"], results["results"]["4"]
    assert small["score"] == 100.0 and small["not_run"] == 0
    assert large["score"] is None and large["not_run"] == 3  # no prompt of N=4 fits
    assert "does not fit (3 of 3)" in (tmp_path / "out" / "results.md").read_text()
    assert sum(engine.calls) == 3  # only the prompts that fit were generated


def test_a_suite_writes_a_run_per_benchmark_and_a_leaderboard(tiny_tokenizer, tmp_path):
    benches = {name: RulerFormat(name, write_ruler_dir(tmp_path / name, [2]))
               for name in ("ruler-hqa", "where-now")}
    task = LongContextTask(LongContextConfig(window=4096, max_new_tokens=16))
    engine = reader(tiny_tokenizer)
    results = evaluate_suite(
        task, engine, benches, out_dir=tmp_path / "out", seed=0, show_progress=False,
        console=quiet(), header=lambda b: run_header(b.name, engine, "scripted", task.config,
                                                     agent="long-context", metric=b.metric))
    assert {n: r["results"]["2"]["score"] for n, r in results.items()} == {
        "ruler-hqa": 100.0, "where-now": 100.0}
    board = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    assert board["benchmarks"]["where-now"] == {"metric": "em", "scores": {"2": 100.0},
                                                "mean": 100.0}
    assert (tmp_path / "out" / "where-now" / "trajectories_2.jsonl").is_file()


def test_memrl_eval_runs_mem1_on_ruler_hqa_and_a_suite(tiny_model_dir, tmp_path):
    """Issue 45's acceptance: a plug-in agent by import path on RULER-HQA, from the command
    line; with two benchmarks x two lengths, the leaderboard (issue 46's suite)."""
    ruler = write_ruler_dir(tmp_path / "ruler", [2, 4])
    state = write_ruler_dir(tmp_path / "state", [2, 4], questions={"Where is Ada?": "Paris"})
    out = tmp_path / "out"
    command = ("eval", f"agent={TASK}", f"model.path={tiny_model_dir}",
               f"eval.benchmarks=[ruler-hqa={ruler}, where-now={state}]", "eval.num_docs=[2,4]",
               f"eval.out_dir={out}", "mem1.max_turn_tokens=8", "rollout.temperature=0",
               "eval.progress=false")
    done = memrl(*command)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "ruler-hqa" / "results.json").read_text())
    assert results["agent"] == TASK and results["benchmark"] == "ruler-hqa"
    assert [results["results"][n]["n"] for n in ("2", "4")] == [3, 3]
    rows = [json.loads(x) for x in (out / "ruler-hqa" / "trajectories_4.jsonl").open()]
    assert len(rows) == 3 and all(r["states"] and "benchmark_scores" in r for r in rows)
    board = (out / "leaderboard.md").read_text()
    assert "| ruler-hqa | sub_em |" in board and "| where-now | em |" in board
    assert (out / "where-now" / "plot.png").is_file()
    # the same command again finds everything done: the results are the same
    again = memrl(*command, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "leaderboard.md").read_text() == board


def test_bad_benchmark_options_are_one_line(tiny_model_dir, tmp_path):
    for args, says in ((["eval.benchmarks=[ruler-hqa]"], "is not NAME=DIR"),
                       ([f"eval.benchmarks=[nope={tmp_path}]"],
                        "eval.benchmarks.0.name: unknown benchmark 'nope'"),
                       ([f"eval.data={tmp_path}", f"eval.benchmarks=[ruler-hqa={tmp_path}]"],
                        "give eval.benchmarks"),
                       ([f"eval.benchmarks=[{{name: ruler-hqa, data_dir: {tmp_path}, "
                         "protocol: memagent}]"], "protocol memagent scores the memagent "
                        "agent, not long_context")):
        (tmp_path / "eval_2.json").write_text("[]")
        done = memrl("eval", "agent=long-context", f"model.path={tiny_model_dir}",
                     f"eval.out_dir={tmp_path / 'out'}", *args)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_benchmark_entry_is_a_benchmark_or_one_line(spec):
    """Whatever the user writes as a benchmark of eval.benchmarks: a Benchmark, or a
    MemrlInputError (the CLI's one line, never a traceback) that says where."""
    try:
        cfg = load_config(EvalConfig, None, base={"model": {"path": "m"},
                                                  "eval": {"benchmarks": [spec]}})
        benches = benchmarks_of(cfg)
    except MemrlInputError as exc:
        assert exc.location and exc.message
        return
    assert list(benches) == [spec.partition("=")[0]]


def test_state_tracking_counts_answers_that_name_a_superseded_state(tmp_path):
    """where-now's `superseded`: an answer naming a place the person left is counted (and
    scored 0), the latest place is right, another word is neither."""
    from memrl.cli import main
    from memrl.eval.benchmark import StateTracking, benchmark_of

    data = tmp_path / "wn"
    assert main(["prepare", "where-now", "--out", str(data), "split=eval", "num_docs=[2]",
                 "eval_questions=6"]) == 0
    bench = benchmark_of("where-now", data, [2])
    assert isinstance(bench, StateTracking)
    records = bench.records(2)
    items = {str(i["index"]): i for i in json.loads((data / "eval_2.json").read_text())}
    with_old = [r for r in records if items[r.id]["superseded"]][:3]
    assert len(with_old) == 3
    rows = [{"id": with_old[0].id, "answer": with_old[0].answers[0]},
            {"id": with_old[1].id, "answer": items[with_old[1].id]["superseded"][0].upper()},
            {"id": with_old[2].id, "answer": "nowhere at all"}]
    bench.score(rows, {r.id: r for r in records})
    assert [r["benchmark_scores"]["em"] for r in rows] == [1.0, 0.0, 0.0]
    assert [r["benchmark_scores"]["superseded"] for r in rows] == [0.0, 1.0, 0.0]
    result = bench.aggregate(2, rows, records)
    assert result["superseded"] == pytest.approx(1 / 3) and result["em"] == pytest.approx(1 / 3)

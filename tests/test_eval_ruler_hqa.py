"""RULER-HQA evaluation: scoring, aggregation, report files, and the CLI end to end."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from memrl.agents import MemAgentConfig
from memrl.cli import main
from memrl.errors import MemrlInputError
from memrl.eval.report import (
    format_cell,
    markdown_table,
    plot_scores,
    read_jsonl,
    write_json,
    write_jsonl,
)
from memrl.eval.ruler_hqa import aggregate, evaluate_ruler_hqa, table_rows
from memrl.inference.scripted import ScriptedGenerator

GOLD = {"Where was Ada born?": "London", "Which river flows through Paris?": "the Seine",
        "Who founded Rome?": "Romulus"}


def ruler_hqa_argv(model, data, out, *overrides, num_docs=None, protocol="memagent-boxed",
                   pool=None):
    """`memrl eval` of MemAgent on RULER-HQA under `protocol` (as MemAgent's task scores it),
    into `out`/ruler-hqa."""
    entry = {"name": "ruler-hqa", "data_dir": str(data), "protocol": protocol,
             **({} if num_docs is None else {"num_docs": list(num_docs)}),
             **({} if pool is None else {"pool": str(pool)})}
    return ["eval", "agent=memagent", f"model.path={model}", f"eval.out_dir={out}",
            f"eval.benchmarks=[{json.dumps(entry)}]", *overrides]


def write_ruler_dir(path, num_docs_list, questions=GOLD, words_per_doc=6):
    """eval_{N}.json files in the published format, written by hand (not by the builder)."""
    path.mkdir(parents=True, exist_ok=True)
    for n in num_docs_list:
        items = []
        for i, (question, answer) in enumerate(questions.items()):
            docs = [f"Document {d + 1}:\nTitle {d}\n" + " ".join(f"w{d}x{k}" for k in
                                                             range(words_per_doc))
                    for d in range(n)]
            docs[n // 2] = f"Document {n // 2 + 1}:\nFact\n{question} {answer}."
            items.append({"index": i, "input": question, "answers": [answer],
                          "context": "\n\n".join(docs), "num_docs": n})
        (path / f"eval_{n}.json").write_text(json.dumps(items), encoding="utf-8")
    return path


def oracle(tokenizer, answer_final=True):
    """Updates write a note; the final turn answers \\boxed{gold} (or nothing)."""

    def respond(prompt: str) -> str:
        if "Updated memory:" in prompt:
            return "noted {braces} kept"
        if not answer_final:
            return "I do not know."
        question = re.search(r"<problem> \n(.*)\n</problem>", prompt).group(1)
        return f"So the answer is \\boxed{{{GOLD[question]}}}."

    return ScriptedGenerator(tokenizer, respond)


CONFIG = MemAgentConfig(chunk_size=40, max_memory_tokens=16, max_final_tokens=16)


def quiet_console():
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False), buf


# ---------------------------------------------------------------- pure pieces


def traj(answer, tokens, chunks, scores, capped=False):
    """A row of a trajectories file, as aggregate reads it."""
    return {"id": "x", "sample_index": 0, "answer": answer, "scores": scores,
            "context_tokens": tokens, "num_chunks": chunks, "capped": capped}


def test_aggregate_and_table_rows_hand_computed():
    trajs = [traj("a", 100, 2, {"em": 1.0, "f1": 1.0, "sub_em": 1.0}),
             traj(None, 300, 4, {"em": 0.0, "f1": 0.5, "sub_em": 0.0}, capped=True)]
    agg = aggregate(trajs)
    assert agg == {"n": 2, "em": 0.5, "f1": 0.75, "sub_em": 0.5, "score": 50.0,
                   "context_tokens": 200.0, "chunks": 3.0, "capped": 1, "no_answer": 1}
    assert table_rows({"50": agg}) == [[50, 200, 3.0, 50.0, 75.0, 50.0]]
    assert aggregate([])["n"] == 0


def test_markdown_table_and_cells():
    assert markdown_table(["N", "F1"], [[50, 12.345], [100, None]]) == (
        "| N | F1 |\n|---|---|\n| 50 | 12.3 |\n| 100 | - |\n"
    )
    assert format_cell(float("nan")) == "-" and format_cell(3) == "3"
    assert format_cell(0.5, digits=3) == "0.500"


def test_json_writers_round_trip(tmp_path):
    rows = [{"a": 1, "s": "é {x}"}, {"cfg": CONFIG, "p": tmp_path}]
    write_jsonl(tmp_path / "t.jsonl", rows)
    back = read_jsonl(tmp_path / "t.jsonl")
    assert back[0] == rows[0]
    assert back[1]["cfg"]["chunk_size"] == 40 and back[1]["p"] == str(tmp_path)
    write_json(tmp_path / "sub" / "r.json", {"x": (1, 2)})
    assert json.loads((tmp_path / "sub" / "r.json").read_text()) == {"x": [1, 2]}
    assert not list(tmp_path.glob("**/.*.tmp"))


def test_plot_scores_writes_a_png(tmp_path):
    out = plot_scores(tmp_path / "p.png", [1000.0, 8000.0], {"sub-EM": [50.0, 40.0]},
                      xlabel="tokens", ylabel="%", labels=["N=1", "N=2"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- the evaluation


def test_oracle_scores_one_and_every_file_is_written(tmp_path, tiny_tokenizer):
    data = write_ruler_dir(tmp_path / "data", [2, 6])
    console, buf = quiet_console()
    gen = oracle(tiny_tokenizer)
    results = evaluate_ruler_hqa(gen, data, [2, 6], config=CONFIG, out_dir=tmp_path / "run",
                                 limit=2, num_samples=2, model_name="oracle", console=console)
    run = tmp_path / "run"
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    assert on_disk["model"] == "oracle" and on_disk["config"]["chunk_size"] == 40
    assert on_disk["num_docs"] == [2, 6] and on_disk["metric"] == "sub_em"
    assert set(on_disk["timings"]["per_num_docs_s"]) == {"2", "6"}
    for n in ("2", "6"):
        r = on_disk["results"][n]
        assert (r["em"], r["f1"], r["sub_em"], r["score"]) == (1.0, 1.0, 1.0, 100.0)
        assert r["n"] == 4 and r["num_records"] == 2 and r["no_answer"] == 0
    assert on_disk["results"]["6"]["context_tokens"] > on_disk["results"]["2"]["context_tokens"]
    assert on_disk["results"]["6"]["chunks"] > 1

    rows = read_jsonl(run / "trajectories_6.jsonl")
    assert [(r["id"], r["sample_index"]) for r in rows] == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    row = rows[0]
    assert row["question"] == "Where was Ada born?" and row["answers"] == ["London"]
    assert row["answer"] == "London" and row["scores"] == {"em": 1.0, "f1": 1.0, "sub_em": 1.0}
    assert row["memories"] == ["noted {braces} kept"] * row["num_chunks"]
    assert row["final_response"] == "So the answer is \\boxed{London}."
    assert len(row["memory_tokens"]) == row["num_chunks"] and row["capped"] is False

    assert (run / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 2 |" in (run / "results.md").read_text()
    printed = buf.getvalue()
    for header in ("context tokens", "chunks", "EM", "F1", "sub-EM", "100.0"):
        assert header in printed
    # lockstep: per N, one call per chunk step plus one final call, each covering all episodes
    assert gen.calls[0] == 4 and gen.calls[-1] == 4


def test_no_answer_scores_zero_and_records_per_run_splits_calls(tmp_path, tiny_tokenizer):
    data = write_ruler_dir(tmp_path / "data", [3])
    gen = oracle(tiny_tokenizer, answer_final=False)
    console, _ = quiet_console()
    results = evaluate_ruler_hqa(gen, data, [3], config=CONFIG, out_dir=tmp_path / "run",
                                 records_per_run=2, console=console, show_progress=False)
    r = results["results"]["3"]
    assert (r["em"], r["f1"], r["sub_em"]) == (0.0, 0.0, 0.0)
    assert r["n"] == 3 and r["no_answer"] == 3
    assert max(gen.calls) == 2 and sum(1 for c in gen.calls if c == 1) >= 1
    rows = read_jsonl(tmp_path / "run" / "trajectories_3.jsonl")
    assert len(rows) == 3 and all(row["answer"] is None for row in rows)


def test_missing_data_and_bad_arguments_are_user_errors(tmp_path, tiny_tokenizer):
    data = write_ruler_dir(tmp_path / "data", [2])
    gen = oracle(tiny_tokenizer)
    with pytest.raises(MemrlInputError, match="eval_50.json"):
        evaluate_ruler_hqa(gen, data, [2, 50], config=CONFIG, out_dir=tmp_path / "o")
    assert gen.calls == []  # nothing generated before the missing file was found
    with pytest.raises(MemrlInputError, match="not found"):
        evaluate_ruler_hqa(gen, tmp_path / "nope", [2], config=CONFIG, out_dir=tmp_path / "o")
    with pytest.raises(MemrlInputError, match="eval.limit"):
        evaluate_ruler_hqa(gen, data, [2], config=CONFIG, out_dir=tmp_path / "o", limit=0)
    with pytest.raises(MemrlInputError, match="eval.num_docs"):
        evaluate_ruler_hqa(gen, data, [], config=CONFIG, out_dir=tmp_path / "o")


# ---------------------------------------------------------------- CLI


def test_cli_user_errors_are_one_line_exit_2(tmp_path, tiny_model_dir, capsys):
    data = write_ruler_dir(tmp_path / "data", [2])
    out = tmp_path / "run"
    assert main(ruler_hqa_argv(tmp_path / "missing", data, out, num_docs=[2])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model directory not found" in err
    assert main(ruler_hqa_argv(data, data, out, num_docs=[2])) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(ruler_hqa_argv(tiny_model_dir, data, out, num_docs=[2, 7])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eval_7.json" in err
    assert main(ruler_hqa_argv(tiny_model_dir, data, out, "memagent.chunk_size=0",
                               num_docs=[2])) == 2
    assert "memagent.chunk_size" in capsys.readouterr().err
    assert main(ruler_hqa_argv(tiny_model_dir, data, out, "eval.limit=0", num_docs=[2])) == 2
    assert "eval.limit" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_real_tiny_model_end_to_end(tmp_path, tiny_model_dir, capsys):
    data = write_ruler_dir(tmp_path / "data", [2, 4], words_per_doc=4)
    run = tmp_path / "run" / "ruler-hqa"
    rc = main(ruler_hqa_argv(
        tiny_model_dir, data, tmp_path / "run", "eval.num_docs=[2,4]", "eval.limit=2",
        "rollout.n=2", "memagent.chunk_size=48", "memagent.max_memory_tokens=6",
        "memagent.max_final_tokens=6", "memagent.temperature=1.0", "memagent.top_p=1.0",
        "memagent.seed=3", "model.device=cpu", "eval.progress=false"))
    assert rc == 0, capsys.readouterr().err
    results = json.loads((run / "results.json").read_text())
    assert results["model"] == str(tiny_model_dir)
    assert results["config"]["seed"] == 3 and results["num_samples"] == 2
    for n in ("2", "4"):
        r = results["results"][n]
        assert r["n"] == 4 and 0.0 <= r["sub_em"] <= 1.0
        rows = read_jsonl(run / f"trajectories_{n}.jsonl")
        assert len(rows) == 4
        assert all(len(m) == row["num_chunks"] for row in rows for m in [row["memories"]])
        assert all(t <= 6 for row in rows for t in row["memory_tokens"])
    assert results["results"]["4"]["chunks"] > results["results"]["2"]["chunks"]
    assert (run / "plot.png").is_file() and (run / "results.md").is_file()
    assert "sub-EM" in capsys.readouterr().out

"""RULER-HQA evaluation: the `memagent` protocol (published prompt and scores), resumable and
additive runs, index-list files with --pool, and interruption of the real CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memrl.agents import PROMPT_PRESETS, MemAgentConfig
from memrl.cli import main
from memrl.errors import MemrlInputError
from memrl.eval import read_jsonl
from memrl.eval.resume import append_episodes, json_line, read_episodes
from memrl.eval.ruler_hqa import aggregate, evaluate_ruler_hqa, table_rows
from memrl.inference.scripted import ScriptedGenerator
from memrl.tasks.memagent_qa import MemAgentQATask
from test_eval_ruler_hqa import ruler_hqa_argv

CONFIG = MemAgentConfig(chunk_size=40, max_memory_tokens=16, max_final_tokens=64)

# TEMPLATE_FINAL of taskutils/memory_eval/utils/recurrent.py (BytedTsinghua-SIA/MemAgent),
# copied by hand from the published file.
PUBLISHED_TEMPLATE_FINAL = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and format your response as follows "Therefore, the answer is (insert answer here)".

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""  # noqa: E501, W291


def write_items(path, items):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items), encoding="utf-8")  # ensure_ascii: "\ud800" escaped
    return path


def item(i, question, answers, n, context=None):
    docs = context if context is not None else "\n\n".join(
        f"Document {d + 1}:\nTitle {d}\nfiller words number {d}" for d in range(n))
    return {"index": i, "input": question, "answers": answers, "context": docs, "num_docs": n}


def question_of(prompt):
    return re.search(r"<problem> \n(.*)\n</problem>", prompt, re.S).group(1)


def test_answer_is_preset_is_the_published_final_prompt_byte_for_byte():
    prompts = PROMPT_PRESETS["memagent-answer-is"]
    assert prompts.final_template == PUBLISHED_TEMPLATE_FINAL
    assert prompts.update_template == PROMPT_PRESETS["memagent"].update_template
    assert prompts.final_text(prompt="Q?", memory="M") == PUBLISHED_TEMPLATE_FINAL.format(
        prompt="Q?", memory="M")
    task = MemAgentQATask(MemAgentConfig(), protocol="memagent")
    assert task.config.resolved_prompts == prompts
    assert MemAgentQATask(MemAgentConfig()).config.resolved_prompts == PROMPT_PRESETS["memagent"]
    with pytest.raises(MemrlInputError, match="unknown protocol"):
        MemAgentQATask(MemAgentConfig(), protocol="ruler")


# the final reply per question, and what the published get_pred makes of it
REPLIES = {
    "Where was Ada born?": "Therefore, the answer is London.",  # all 1
    "Who founded Rome?": "Therefore, the answer is Remus.",  # answers[1] only: 0
    "Which river?": "Therefore, the answer is the.",  # normalises to "": credited 1
    "Capital of France?": "<think>x</think>I think Paris.",  # no marker: None, 0
    "Tallest mountain?": "",  # exactly empty: dropped from the published means
}
ANSWERS = {"Where was Ada born?": ["London"], "Who founded Rome?": ["Romulus", "Remus"],
           "Which river?": ["the Seine"], "Capital of France?": ["Paris"],
           "Tallest mountain?": ["Everest"]}


def scripted(tokenizer, prompts_seen=None):
    def respond(prompt):
        if "Updated memory:" in prompt:
            return "noted"
        if prompts_seen is not None:
            prompts_seen.append(prompt)
        return REPLIES[question_of(prompt).strip()]

    return ScriptedGenerator(tokenizer, respond)


def test_protocol_memagent_scores_as_published(tmp_path, tiny_tokenizer):
    items = [item(i, f"  {q}\n", ANSWERS[q], 2) for i, q in enumerate(REPLIES)]
    data = tmp_path / "data"
    write_items(data / "eval_2.json", items)
    seen: list[str] = []
    results = evaluate_ruler_hqa(scripted(tiny_tokenizer, seen), data, [2], config=CONFIG,
                                 out_dir=tmp_path / "run", protocol="memagent",
                                 show_progress=False)
    # the published final prompt, the question stripped
    assert all('"Therefore, the answer is (insert answer here)"' in p for p in seen)
    assert all("<problem> \n" + question_of(p) + "\n</problem>" in p for p in seen)
    assert all(question_of(p) == question_of(p).strip() for p in seen)

    r = results["results"]["2"]
    # kept: 4 of 5 (the exactly-empty reply is dropped); sub-EM 1 + 0 + 1 + 0 -> 50.0
    assert r["published"] == {"sub_em": 50.0, "em": 25.0, "f1": 25.0}
    assert r["score"] == 50.0 and r["dropped"] == 1 and r["n"] == 5
    # strict companions over all 5: EM 1/5, strict sub-EM 1/5; empty preds: "the", None, ""
    assert r["em"] == pytest.approx(0.2) and r["strict_sub_em"] == pytest.approx(0.2)
    assert r["empty_predictions"] == 3 and r["empty_credited"] == 1
    assert r["no_answer"] == 2
    [row] = table_rows(results["results"], "memagent")
    assert row[0] == 2 and row[3:] == [50.0, 25.0, 20.0, 20.0, 3, 4]
    md = (tmp_path / "run" / "results.md").read_text()
    assert "protocol memagent" in md and "sub-EM (published)" in md and "strict sub-EM" in md
    rows = {row["question"].strip(): row for row in read_jsonl(tmp_path / "run" /
                                                               "trajectories_2.jsonl")}
    assert rows["Where was Ada born?"]["answer"] == "London"
    assert rows["Which river?"]["scores"]["empty_credited"] == 1.0
    assert rows["Capital of France?"]["answer"] is None

    # the same replies under memagent-boxed: no \boxed{} anywhere -> every score 0
    boxed = evaluate_ruler_hqa(scripted(tiny_tokenizer), data, [2], config=CONFIG,
                               out_dir=tmp_path / "boxed", show_progress=False)
    assert boxed["results"]["2"]["sub_em"] == 0.0 and "published" not in boxed["results"]["2"]


def test_aggregate_published_from_rows_hand_computed():
    def row(answer, sub, em, f1, strict, empty, credited=0.0, dropped=0.0):
        return {"answer": answer, "answers": ["gold"], "context_tokens": 10, "num_chunks": 1,
                "capped": False, "scores": {
                    "sub_em": sub, "em": em, "f1": f1, "f1_unrounded": f1,
                    "strict_sub_em": strict, "prediction_empty": empty,
                    "empty_credited": credited, "dropped_by_published_mean": dropped}}

    rows = [row("gold", 1.0, 1.0, 1.0, 1.0, 0.0), row("go", 1.0, 0.0, 0.67, 0.0, 0.0),
            row("a", 1.0, 0.0, 0.0, 0.0, 1.0, credited=1.0), row(None, 0.0, 0.0, 0.0, 0.0, 1.0)]
    agg = aggregate(rows, "memagent")
    # published: (1 + 1 + 1 + 0) * 100 / 4 = 75.0; F1 (1 + .67) * 100 / 4 = 41.75
    assert agg["published"] == {"sub_em": 75.0, "em": 25.0, "f1": 41.75}
    assert agg["strict_sub_em"] == 0.25 and agg["empty_predictions"] == 2
    assert agg["empty_credited"] == 1 and agg["dropped"] == 0


# ---------------------------------------------------------------- resumable and additive


def counting(tokenizer):
    """Final answers \\boxed{ans<i>}; records which questions reached a final call."""
    finals: list[str] = []

    def respond(prompt):
        if "Updated memory:" in prompt:
            return "noted"
        q = question_of(prompt)
        finals.append(q)
        return f"\\boxed{{ans{q.split()[1].rstrip('?')}}}"

    gen = ScriptedGenerator(tokenizer, respond)
    gen.finals = finals
    return gen


def write_set(data, ns, count=5):
    for n in ns:
        write_items(data / f"eval_{n}.json",
                    [item(i, f"Question {i}?", [f"ans{i}"], n) for i in range(count)])
    return data


def test_rerun_skips_finished_episodes_and_adds_new_n(tmp_path, tiny_tokenizer):
    data = write_set(tmp_path / "data", [2, 6])
    out = tmp_path / "run"
    kw = dict(config=CONFIG, out_dir=out, records_per_run=2, show_progress=False)
    gen = counting(tiny_tokenizer)
    evaluate_ruler_hqa(gen, data, [2], limit=3, **kw)
    assert sorted(gen.finals) == ["Question 0?", "Question 1?", "Question 2?"]
    gen.finals.clear()
    results = evaluate_ruler_hqa(gen, data, [2], **kw)  # more records: only the new ones run
    assert sorted(gen.finals) == ["Question 3?", "Question 4?"]
    assert results["results"]["2"]["n"] == 5 and results["results"]["2"]["sub_em"] == 1.0
    gen.finals.clear()
    results = evaluate_ruler_hqa(gen, data, [2], resume=True, **kw)  # nothing left to do
    assert gen.finals == []
    # one more N is added to the results, the table and the plot
    results = evaluate_ruler_hqa(gen, data, [6], limit=2, **kw)
    assert set(results["results"]) == {"2", "6"} and results["num_docs"] == [2, 6]
    assert results["results"]["2"]["n"] == 5 and results["results"]["6"]["n"] == 2
    on_disk = json.loads((out / "results.json").read_text())
    assert set(on_disk["results"]) == {"2", "6"}
    md = (out / "results.md").read_text()
    assert "| 2 |" in md and "| 6 |" in md
    assert len(read_jsonl(out / "trajectories_2.jsonl")) == 5

    # another config, model or protocol is refused with one line, before any generation
    gen.finals.clear()
    with pytest.raises(MemrlInputError, match=r"config.chunk_size \(40 there, 41 now\)"):
        evaluate_ruler_hqa(gen, data, [2], config=CONFIG.model_copy(update={"chunk_size": 41}),
                           out_dir=out, show_progress=False)
    with pytest.raises(MemrlInputError, match="different protocol"):
        evaluate_ruler_hqa(gen, data, [2], protocol="memagent", **kw)
    with pytest.raises(MemrlInputError, match="different model"):
        evaluate_ruler_hqa(gen, data, [2], model_name="other", **kw)
    with pytest.raises(MemrlInputError, match="nothing to resume"):
        evaluate_ruler_hqa(gen, data, [2], **{**kw, "out_dir": tmp_path / "new"}, resume=True)
    assert gen.finals == []


def test_torn_last_line_is_dropped_and_rerun(tmp_path, tiny_tokenizer):
    data = write_set(tmp_path / "data", [2], count=3)
    out = tmp_path / "run"
    gen = counting(tiny_tokenizer)
    evaluate_ruler_hqa(gen, data, [2], config=CONFIG, out_dir=out, show_progress=False)
    path = out / "trajectories_2.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2]) + lines[2][:25])  # a kill in the middle of a write
    gen.finals.clear()
    results = evaluate_ruler_hqa(gen, data, [2], config=CONFIG, out_dir=out,
                                 show_progress=False)
    assert gen.finals == ["Question 2?"] and results["results"]["2"]["n"] == 3
    assert [r["id"] for r in read_jsonl(path)] == ["0", "1", "2"]


def test_lone_surrogate_in_a_record_loses_nothing(tmp_path, tiny_tokenizer):
    data = tmp_path / "data"
    write_items(data / "eval_2.json", [
        item(0, "Question 0?", ["ans0"], 2),
        item(1, "Question 1?", ["ans1"], 2, context="Document 1:\nT\nbad \ud800 text")])
    write_items(data / "eval_6.json", [{**item(0, "Question 0?", ["ans0"], 6),
                                        "input": "Question 0? \ud800"}])
    assert "\\ud800" in (data / "eval_2.json").read_text()
    out = tmp_path / "run"
    gen = counting(tiny_tokenizer)
    # the context is read with U+FFFD in place of the surrogate (tokenizers reject it)
    results = evaluate_ruler_hqa(gen, data, [2], config=CONFIG, out_dir=out,
                                 records_per_run=1, show_progress=False)
    assert results["results"]["2"]["n"] == 2 and results["results"]["2"]["sub_em"] == 1.0
    # a question the loader rejects is one line when its N is reached; N=2 stays
    with pytest.raises(MemrlInputError, match="eval_6.json item 0"):
        evaluate_ruler_hqa(gen, data, [6], config=CONFIG, out_dir=out, show_progress=False)
    assert len(read_jsonl(out / "trajectories_2.jsonl")) == 2
    assert set(json.loads((out / "results.json").read_text())["results"]) == {"2"}
    # the writers themselves never fail on one, and read it back exactly
    append_episodes(tmp_path / "t.jsonl", [{"id": "x\ud800", "sample_index": 0}])
    assert json_line({"a": "\ud800é"}) == '{"a": "\\ud800é"}\n'.encode()
    assert list(read_episodes(tmp_path / "t.jsonl")) == [("x\ud800", 0)]


@settings(max_examples=60, deadline=None)
@given(tail=st.binary(max_size=200), rows=st.integers(0, 3))
def test_read_episodes_keeps_every_complete_row_whatever_follows(tmp_path_factory, tail, rows):
    assume(b"sample_index" not in tail)  # a complete row in the tail would win, by design
    path = tmp_path_factory.mktemp("episodes") / "t.jsonl"
    good = [{"id": str(k), "sample_index": 0, "v": "é\ud800"} for k in range(rows)]
    append_episodes(path, good)
    with open(path, "ab") as f:
        f.write(b"\n" + tail)  # garbage after the last complete row (never a parse error)
    read = read_episodes(path)
    for row in good:
        assert read[(row["id"], 0)] == row
    again = read_episodes(path)  # the file was repaired: it reads the same, ends in "\n"
    assert again == read and path.read_bytes()[-1:] in (b"", b"\n")


# ---------------------------------------------------------------- CLI: --protocol, --pool


def dev_file(path, paragraphs):
    """A HotpotQA dev JSON whose pool is `paragraphs` (title, text) after sorting."""
    ctx = [[title, [text]] for title, text in paragraphs]
    path.write_text(json.dumps([{"_id": "a", "question": "q", "answer": "x", "context": ctx}]))
    return path


TINY = ["memagent.chunk_size=48", "memagent.max_memory_tokens=4", "memagent.max_final_tokens=4",
        "memagent.temperature=1.0", "memagent.top_p=1.0", "memagent.seed=3", "model.device=cpu",
        "eval.progress=false"]


def test_cli_pool_index_lists_and_num_docs_errors(tmp_path, tiny_model_dir, capsys):
    pool = dev_file(tmp_path / "dev.json", [("Alpha", "a text."), ("Beta", "b text."),
                                            ("Gamma", "g text.")])
    data = tmp_path / "data"
    write_items(data / "eval_3.json", [item(0, "Q?", ["a"], 3, context=[2, 0, 1])])
    def run(out, pool=None, protocol="memagent-boxed"):
        return main(ruler_hqa_argv(tiny_model_dir, data, out, *TINY, num_docs=[3],
                                   protocol=protocol, pool=pool))

    def fails(*args, **kwargs):
        assert run(*args, **kwargs) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
        return err

    assert "list of paragraph indices" in fails(tmp_path / "r0")
    assert "pool file not found" in fails(tmp_path / "r1", pool=tmp_path / "missing.json")
    write_items(data / "eval_3.json", [item(0, "Q?", ["a"], 3, context=[2, 0, 7])])
    err = fails(tmp_path / "r2", pool=pool)
    assert "context[2] = 7 is out of range for the pool of 3 paragraphs" in err
    write_items(data / "eval_3.json", [item(0, "Q?", ["a"], 5)])
    assert "num_docs is 5 but the file was loaded as N=3" in fails(tmp_path / "r3")
    assert "eval.benchmarks.0.protocol" in fails(tmp_path / "r4", protocol="x")

    write_items(data / "eval_3.json", [item(0, "Q?", ["a"], 3, context=[2, 0, 1])])
    assert run(tmp_path / "ok", pool=pool, protocol="memagent") == 0
    out = tmp_path / "ok" / "ruler-hqa"
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"] == "memagent" and results["results"]["3"]["n"] == 1
    assert "protocol memagent" in " ".join(capsys.readouterr().out.split())  # wrapped or not
    assert "| sub-EM (published) |" in (out / "results.md").read_text()
    # the same directory with another protocol: refused before the model is loaded
    assert "different protocol" in fails(tmp_path / "ok", pool=pool)


# ---------------------------------------------------------------- interruption


def results_without_timings(path):
    results = json.loads(path.read_text())["results"]
    for r in results.values():
        r.pop("seconds")
    return results


def sorted_rows(path):
    return sorted(read_jsonl(path), key=lambda r: (r["id"], r["sample_index"]))


def kill_args(data, model, out):
    return ruler_hqa_argv(model, data, out, "eval.records_per_run=2", "rollout.n=2", *TINY,
                          num_docs=[2], protocol="memagent")


@pytest.fixture(scope="module")
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the subprocesses run with one thread too: same numerics
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, tiny_model_dir, one_thread):
    """An uninterrupted run of the set the kill tests interrupt: (data dir, run dir)."""
    root = tmp_path_factory.mktemp("kill_reference")
    data = write_set(root / "data", [2], count=12)
    assert main(kill_args(data, tiny_model_dir, root / "ref")) == 0
    return data, root / "ref" / "ruler-hqa"


@pytest.mark.pipeline
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM],
                         ids=["SIGKILL", "SIGINT", "SIGTERM"])
def test_kill_mid_n_then_resume_equals_an_uninterrupted_run(tmp_path, tiny_model_dir, sig,
                                                            reference_run, capsys):
    data, ref = reference_run
    args = kill_args(data, tiny_model_dir, tmp_path / "run")
    out = tmp_path / "run" / "ruler-hqa"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "memrl", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    traj = out / "trajectories_2.jsonl"
    deadline = time.monotonic() + 120
    while not (traj.is_file() and traj.read_bytes().count(b"\n") >= 4):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    done = traj.read_bytes().count(b"\n")
    assert 4 <= done < 24  # killed mid-N
    if sig != signal.SIGKILL:
        assert proc.returncode == 128 + sig
        assert err.count("\n") == 1 and err.startswith(f"interrupted ({sig.name})")
        assert "run the same command again" in err
    else:
        assert proc.returncode == -signal.SIGKILL

    capsys.readouterr()
    assert main(args) == 0
    assert f"{done} of 24 episodes already" in capsys.readouterr().out
    assert results_without_timings(out / "results.json") == \
        results_without_timings(ref / "results.json")
    assert sorted_rows(traj) == sorted_rows(ref / "trajectories_2.jsonl")

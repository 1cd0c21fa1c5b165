"""The long-context baseline: one prompt with the whole document, "does not fit" past the window."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from memrl.cli import main
from memrl.errors import MemrlInputError
from memrl.eval.long_context import (
    LONG_CONTEXT_TEMPLATE,
    LongContextConfig,
    evaluate_long_context,
    long_context_prompt,
    table_rows,
)
from memrl.inference.scripted import ScriptedGenerator
from test_eval_ruler_hqa import GOLD, write_ruler_dir


def reader(tokenizer):
    """Answers \\boxed{gold} only when the gold fact is in the article it was given."""

    def respond(prompt: str) -> str:
        question = re.search(r"<problem> \n(.*)\n</problem>", prompt).group(1)
        article = re.search(r"<article>\n(.*)\n</article>", prompt, re.DOTALL).group(1)
        gold = GOLD[question]
        return f"\\boxed{{{gold}}}" if f"{question} {gold}." in article else "\\boxed{no}"

    return ScriptedGenerator(tokenizer, respond)


def test_prompt_holds_question_and_whole_article(tiny_tokenizer):
    ids = long_context_prompt(tiny_tokenizer, "Where was Ada born?", "Document 1:\nx {memory}")
    text = tiny_tokenizer.decode(ids)
    assert "<problem> \nWhere was Ada born?\n</problem>" in text
    assert "<article>\nDocument 1:\nx {memory}\n</article>" in text  # braces kept literally
    assert "\\boxed{}" in LONG_CONTEXT_TEMPLATE


def test_scores_where_it_fits_and_says_where_it_does_not(tmp_path, tiny_tokenizer):
    data = write_ruler_dir(tmp_path / "data", [2, 40])
    lengths = {n: max(len(long_context_prompt(tiny_tokenizer, q, c)) for q, c in
                      ((r["input"], r["context"]) for r in
                       json.loads((data / f"eval_{n}.json").read_text())))
               for n in (2, 40)}
    window = lengths[2] + 16  # N=2 fits with its 16-token answer budget, N=40 does not
    assert lengths[40] + 16 > window
    gen = reader(tiny_tokenizer)
    results = evaluate_long_context(
        gen, data, [2, 40], out_dir=tmp_path / "out",
        config=LongContextConfig(window=window, max_new_tokens=16),
        console=Console(file=open(tmp_path / "log", "w")))
    two, forty = results["results"]["2"], results["results"]["40"]
    assert two["fits"] and two["n"] == 3 and two["score"] == 100.0
    assert not forty["fits"] and forty["n"] == 0 and forty["score"] is None
    assert gen.calls == [3]  # nothing that does not fit is sent
    rows = table_rows(results["results"])
    assert rows[0][2] == "3/3" and rows[0][-1] == 100.0
    assert rows[1][2:4] == ["0/3", "does not fit"]
    saved = [json.loads(line) for line in
             (tmp_path / "out" / "answers_2.jsonl").read_text().splitlines()]
    assert {r["answer"] for r in saved} == set(GOLD.values())
    assert "does not fit" in (tmp_path / "out" / "results.md").read_text()


def test_window_must_leave_room(tmp_path, tiny_tokenizer):
    data = write_ruler_dir(tmp_path / "data", [2])
    with pytest.raises(MemrlInputError, match="no room"):
        evaluate_long_context(reader(tiny_tokenizer), data, [2], out_dir=tmp_path / "o",
                              config=LongContextConfig(window=16, max_new_tokens=16))


def test_cli_end_to_end_and_bad_input(tmp_path, tiny_model_dir, capsys):
    data = write_ruler_dir(tmp_path / "data", [2])
    out = tmp_path / "out"
    args = ["eval", "agent=long-context", f"model.path={tiny_model_dir}",
            f"eval.benchmarks=[ruler-hqa={data}]", "eval.num_docs=[2]", f"eval.out_dir={out}"]
    assert main([*args, "long_context.max_new_tokens=4"]) == 0
    results = json.loads((out / "ruler-hqa" / "results.json").read_text())
    assert results["benchmark"] == "ruler-hqa" and results["agent"].endswith("LongContextTask")
    window = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    assert results["config"]["window"] == window  # the model's own window by default
    assert main([*args, "long_context.max_new_tokens=0"]) == 2
    assert "long_context.max_new_tokens" in capsys.readouterr().err
    assert main([*args, f"model.path={tmp_path / 'none'}"]) == 2
    assert main([*args, "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=1.5"]) == 2
    assert "rollout.vllm.gpu_memory_utilization" in capsys.readouterr().err

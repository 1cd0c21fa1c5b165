"""The long-context baseline: one prompt with the whole document, "does not fit" past the
window; `memrl eval agent=long-context` on a benchmark."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main
from memrl.eval.long_context import LONG_CONTEXT_TEMPLATE, LongContextConfig, long_context_prompt
from test_eval_ruler_hqa import write_ruler_dir


def test_prompt_holds_question_and_whole_article(tiny_tokenizer):
    ids = long_context_prompt(tiny_tokenizer, "Where was Ada born?", "Document 1:\nx {memory}")
    text = tiny_tokenizer.decode(ids)
    assert "<problem> \nWhere was Ada born?\n</problem>" in text
    assert "<article>\nDocument 1:\nx {memory}\n</article>" in text  # braces kept literally
    assert "\\boxed{}" in LONG_CONTEXT_TEMPLATE


def test_window_must_leave_room():
    """(That a record which does not fit is not run: tests/test_eval_benchmark.py.)"""
    with pytest.raises(ValueError, match="no room"):
        LongContextConfig(window=16, max_new_tokens=16)
    assert LongContextConfig(window=17, max_new_tokens=16).window == 17


def test_cli_end_to_end_and_bad_input(tmp_path, tiny_model_dir, capsys):
    data = write_ruler_dir(tmp_path / "data", [2])
    out = tmp_path / "out"
    args = ["eval", "agent=long-context", f"model.path={tiny_model_dir}",
            f"eval.benchmarks=[ruler-hqa={data}]", "eval.num_docs=[2]", f"eval.out_dir={out}"]
    assert main([*args, "long_context.max_new_tokens=4"]) == 0
    results = json.loads((out / "ruler-hqa" / "results.json").read_text())
    assert results["benchmark"] == "ruler-hqa" and results["agent"] == "long-context"
    window = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    assert results["config"]["window"] == window  # the model's own window by default
    assert main([*args, "long_context.max_new_tokens=0"]) == 2
    assert "long_context.max_new_tokens" in capsys.readouterr().err
    assert main([*args, f"model.path={tmp_path / 'none'}"]) == 2
    assert main([*args, "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=1.5"]) == 2
    assert "rollout.vllm.gpu_memory_utilization" in capsys.readouterr().err

"""`memrl eval [CONFIG] [k=v ...]`: an evaluation described by a typed config (training's names
for the model, the agent and the engine), run by the one evaluation runner; the same run
written as a file or as overrides alone gives the same trajectories."""

from __future__ import annotations

import json

import pytest

from memrl.config import load_config
from memrl.errors import MemrlInputError
from memrl.recipes.evaluate import EvalConfig
from test_eval_ruler_hqa import write_ruler_dir
from test_plugin_agent import TASK, memrl


def write_config(path, model, ruler, out, agent=TASK,
                 section="mem1: {max_turn_tokens: 8}") -> str:
    path.write_text(
        f"agent: {agent}\n"
        f"model: {{path: {model}}}\n"
        "rollout: {engine: hf, temperature: 0}\n"
        f"{section}\n"
        "eval:\n"
        f"  out_dir: {out}\n"
        f"  benchmarks: [{{name: ruler-hqa, data_dir: {ruler}, num_docs: [2, 4]}}]\n")
    return str(path)


def test_memrl_eval_config_runs_mem1_on_ruler_hqa_as_eval_agent_does(tiny_model_dir, tmp_path):
    ruler = write_ruler_dir(tmp_path / "ruler", [2, 4])
    config = write_config(tmp_path / "eval.yaml", tiny_model_dir, ruler, tmp_path / "out")
    done = memrl("eval", config, "eval.limit=2")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "ruler-hqa" / "results.json").read_text())
    assert results["agent"] == TASK and results["benchmark"] == "ruler-hqa"
    assert [results["results"][n]["n"] for n in ("2", "4")] == [2, 2]
    assert "| ruler-hqa | sub_em |" in (tmp_path / "out" / "leaderboard.md").read_text()
    # no file: the same run from overrides alone, the benchmark in its short form
    old = memrl("eval", f"agent={TASK}", f"model.path={tiny_model_dir}",
                f"eval.benchmarks=[ruler-hqa={ruler}]", "eval.num_docs=[2,4]", "eval.limit=2",
                f"eval.out_dir={tmp_path / 'old'}", "mem1.max_turn_tokens=8",
                "rollout.temperature=0", "eval.progress=false")
    assert old.returncode == 0, old.stderr[-3000:]
    for n in (2, 4):
        new_rows = (tmp_path / "out" / "ruler-hqa" / f"trajectories_{n}.jsonl").read_text()
        old_rows = (tmp_path / "old" / "ruler-hqa" / f"trajectories_{n}.jsonl").read_text()
        assert new_rows == old_rows
    again = memrl("eval", config, "eval.limit=2", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.parametrize("override, says", [
    ("eval.benchmarks=[]", "eval.benchmarks"),
    ("rollout.base_url=http://x", "rollout.base_url"),
    ("eval.nope=1", "eval.nope"),
    ("eval.benchmarks=[ruler-hqa]", "is not NAME=DIR"),
    ("eval.benchmarks=[{name: where-now, data_dir: d, protocol: memagent}]",
     "protocol is read by the ruler-hqa benchmark only"),
    ("eval.benchmarks=[{name: ruler-hqa, data_dir: d, categories: [1]}]",
     "categories is read by the locomo benchmark only"),
    ("eval.data=x.json", "give eval.benchmarks"),
    ("eval.limit=0", "eval.limit"),
])
def test_bad_eval_configs_are_one_located_error(tmp_path, override, says):
    config = write_config(tmp_path / "eval.yaml", tmp_path, tmp_path, tmp_path / "out",
                          agent="memagent", section="memagent: {chunk_size: 64}")
    with pytest.raises(MemrlInputError, match=says.replace(".", r"\.")):
        load_config(EvalConfig, config, [override])


def test_a_missing_model_or_benchmark_is_one_line(tiny_model_dir, tmp_path):
    config = write_config(tmp_path / "eval.yaml", tmp_path / "none", tmp_path, tmp_path / "o")
    done = memrl("eval", config)
    assert done.returncode == 2 and "model.path" in done.stderr, done.stderr
    done = memrl("eval", config, f"model.path={tiny_model_dir}",
                 "eval.benchmarks=[{name: nope, data_dir: .}]")
    assert done.returncode == 2 and "eval.benchmarks.0.name: unknown benchmark 'nope'" \
        in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_short_benchmark_form_and_the_lengths_of_every_benchmark(tmp_path):
    cfg = load_config(EvalConfig, None, [f"model.path={tmp_path}", "eval.num_docs=[2]",
                                         "eval.benchmarks=[ruler-hqa=a, {name: locomo, "
                                         "data_dir: b, split: heldout, categories: [1, 5]}]"])
    first, second = cfg.eval.benchmarks
    assert (first.name, first.data_dir, first.num_docs) == ("ruler-hqa", "a", None)
    assert second.options() == {"categories": [1, 5], "split": "heldout"}
    assert cfg.eval.num_docs == [2] and cfg.eval.records_per_run is None


def test_the_long_context_reader_is_an_agent_of_a_config(tmp_path):
    config = write_config(tmp_path / "eval.yaml", tmp_path, tmp_path, tmp_path / "out",
                          agent="long-context", section="long_context: {window: 100}")
    cfg = load_config(EvalConfig, config, ["rollout.openai.base_urls=[http://h:1/v1]"])
    assert cfg.agent_config.window == 100 and cfg.rollout.n == 1
    assert cfg.rollout.openai.base_urls == ["http://h:1/v1"]

"""`memrl eval CONFIG [k=v ...]`: an evaluation described by a typed config (training's names
for the model, the agent and the engine), run by the one evaluation runner; the same run as
`memrl eval agent --benchmark ...` gives the same trajectories."""

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
    old = memrl("eval", "agent", "--agent", TASK, "--model", str(tiny_model_dir),
                "--benchmark", f"ruler-hqa={ruler}", "--num-docs", "2", "4", "--limit", "2",
                "--out", str(tmp_path / "old"), "--set", "mem1.max_turn_tokens=8",
                "--set", "rollout.temperature=0", "--quiet")
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
    done = memrl("eval", config, f"model.path={tiny_model_dir}", "eval.benchmarks=[{name: nope, data_dir: .}]")
    assert done.returncode == 2 and "eval.benchmarks.0.name: unknown benchmark 'nope'" \
        in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_config_path_is_told_from_a_command_name(tmp_path, monkeypatch):
    from memrl.cli.app import is_config_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "evalcfg").write_text("{}")
    assert is_config_path("eval.yaml") and is_config_path("a/b") and is_config_path("evalcfg")
    assert not is_config_path("nope") and not is_config_path("--resume")


def test_the_long_context_reader_is_an_agent_of_a_config(tmp_path):
    config = write_config(tmp_path / "eval.yaml", tmp_path, tmp_path, tmp_path / "out",
                          agent="long-context", section="long_context: {window: 100}")
    cfg = load_config(EvalConfig, config, ["rollout.openai.base_urls=[http://h:1/v1]"])
    assert cfg.agent_config.window == 100 and cfg.rollout.n == 1
    assert cfg.rollout.openai.base_urls == ["http://h:1/v1"]

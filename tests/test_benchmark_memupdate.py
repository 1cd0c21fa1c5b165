"""benchmarks/real_model_memupdate_gpu.py: its settings and table by hand, and `--plan tiny`
end to end on the CPU (the tiny model, the real LoCoMo file): a run whose GRPO fails, the
re-run that finishes it, then a re-run that skips every stage)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "real_model_memupdate_gpu.py"


def load_script():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("bench_real_model_memupdate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_evaluations_use_the_training_settings_and_the_table_reads_results():
    bench = load_script()
    settings = bench.memupdate_settings(bench.PLANS["full"])
    assert settings["embedder"] == "minilm" and settings["answerer"] == "retrieval"
    args = bench.eval_args(bench.PLANS["full"], settings, Path("m"), Path("d"), Path("o"))
    for key in bench.EVAL_KEYS:  # every memupdate setting of the config reaches the eval
        assert f"memupdate.{key}={settings[key]}" in args
    entry = json.loads(next(a for a in args if a.startswith("eval.benchmarks=")).split("=", 1)[1])
    assert entry == [{"name": "locomo", "data_dir": "d", "split": "heldout",
                      "categories": [1, 2, 3, 4]}]
    per = {"n": 2, "valid_call_rate": 0.5, "memory_size_final": 12.0, "reward": 0.125,
           "recall_at_k_final": 0.25, "f1_final": 0.5,
           "memory": {"per_session": {"calls": 3.0}}}
    results = {"all": per, "2": {**per, "f1_final": 1.0}}
    assert bench.row_cells(results) == ["50.0", "3.00", "12.00", "0.125", "25.0", "-", "100.0",
                                        "-", "-", "50.0"]


def test_the_budget_plan_changes_grpo_reward_only():
    bench = load_script()
    full, budget = bench.PLANS["full"], bench.PLANS["rl-budget300"]
    assert bench.rl_settings(full) == bench.memupdate_settings(full)
    assert bench.memupdate_settings(full)["efficiency_budget"] == 150
    # GRPO trains with 300; every evaluation keeps the config's 150
    assert bench.rl_settings(budget) == {**bench.memupdate_settings(full),
                                         "efficiency_budget": 300}
    assert "memupdate.efficiency_budget=300" in bench.overrides(bench.rl_settings(budget))
    settings = bench.memupdate_settings(budget)
    args = bench.eval_args(budget, settings, Path("m"), Path("d"), Path("o"))
    assert "memupdate.efficiency_budget=150" in args


@pytest.mark.pipeline
@pytest.mark.slow
def test_tiny_plan_runs_every_stage_and_reports_every_row(tmp_path, shared_data, monkeypatch,
                                                          capsys):
    # One torch thread a process: SFT and the base evaluation run side by side, and the
    # suite's other worker shares the two cores.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TORCH_COMPILE_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    work, out = tmp_path / "work", tmp_path / "out"
    locomo = shared_data / "locomo" / "locomo10.json"
    stages = ("init_model", "data_train", "data_heldout", "sft", "eval_base", "sft_export",
              "rl_train", "eval_warm_start", "rl_export", "eval_rl")

    # First a GRPO run that fails (here: a key the config does not have): the rows evaluated
    # before it (base, warm start) and the report are still written, then the pipeline fails
    # naming it
    for key in ("PYTHONPATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TORCH_COMPILE_DISABLE",
                "OMP_NUM_THREADS"):
        monkeypatch.setenv(key, env[key])
    bench = load_script()
    plan = bench.PLANS["tiny"]
    failing = type(plan)(**{**plan.__dict__, "rl_overrides": (*plan.rl_overrides,
                                                              "rl.no_such_key=1")})
    with pytest.raises(SystemExit, match="rl_train"):
        bench.pipeline(failing, work, out, locomo)
    failed = capsys.readouterr().out
    assert "] rl_train: exit 2" in failed
    assert (out / "warm_start" / "locomo" / "results.json").is_file()
    assert not (out / "rl").exists()
    table = (out / "tables.md").read_text()
    assert "| base model |" in table and "| warm start (SFT on the oracle) |" in table
    assert "| RL (GRPO) |" not in table

    # `--plan tiny` again: the stages done are skipped, GRPO and the rest run; every stage
    # has run once, to exit 0
    command = [sys.executable, str(SCRIPT), "--plan", "tiny", "--work", str(work), "--out",
               str(out), "--locomo", str(locomo)]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stage in stages:
        runs = [f"] {stage}: exit 0" in text for text in (failed, proc.stdout)]
        assert runs.count(True) == 1, (stage, runs)
    for stage in ("rl_train", "rl_export", "eval_rl"):
        assert f"] {stage}: exit 0" in proc.stdout, stage
    table = (out / "tables.md").read_text()
    for name in ("base model", "warm start (SFT on the oracle)", "RL (GRPO)"):
        assert f"| {name} |" in table
    assert "| evidence recall@5 % |" in table and "QA F1 2 temporal %" in table
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"base", "warm_start", "rl"}
    for row in summary["results"].values():  # the plan's episodes hold categories 1-4
        assert {"1", "2", "3", "4", "all"} <= set(row)
    assert summary["plan"]["memupdate"]["embedder"] == "hashing"
    assert summary["reward_curve"] and (out / "reward_curve.png").stat().st_size > 0
    for row in ("base", "warm_start", "rl"):
        assert (out / row / "locomo" / "view.html").is_file()
        results = json.loads((out / row / "locomo" / "results.json").read_text())
        assert results["results"]["heldout"]["num_records"] == 5
    with tarfile.open(tmp_path / "out.tar.gz") as tar:
        assert "out/tables.md" in tar.getnames()
    # run again: every stage is skipped, the report is written again
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "exit 0" not in again.stdout
    assert (out / "tables.md").read_text() == table

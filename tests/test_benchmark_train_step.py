"""The training benchmark's update-only mode runs on CPU with a tiny shape (so it is checked):
uneven batches, padded or packed, one row per micro-batch token budget."""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import pytest

from memrl.run.record import read_record

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_step_gpu.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("train_step_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_update_only_tiny_run(tmp_path, packed):
    bench = load_benchmark()
    argv = ["--update-only", "--tiny", "--device", "cpu", "--samples", "8", "--budgets",
            "200,400", "--peak-tflops", "1", "--json-out", str(tmp_path / "s.json")]
    summary = bench.main(argv + (["--remove-padding"] if packed else []))
    settings, rows = summary["settings"], summary["budgets"]
    assert settings["remove_padding"] is packed and settings["samples"] == 8
    assert [r["budget"] for r in rows] == [200, 400]
    for row in rows:
        assert (row["padding_waste"] == 0) is packed
        if packed:  # real tokens only: every token once, split into the micro-batches
            assert row["tokens_per_micro_batch"] * row["micro_batches"] == settings["tokens"]
        assert row["update_tokens_per_s"] > 0
        assert row["mfu"] == pytest.approx(row["update_model_tflops_per_s"])  # peak: 1 TFLOP/s
    assert rows[0]["micro_batches"] >= rows[1]["micro_batches"]
    assert (tmp_path / "s.json").exists()
    record = read_record(tmp_path / "s.run.json")  # the run record beside the results
    assert (record["kind"], record["status"]) == ("benchmark train_step_gpu", "ok")


def test_gc_pauses_time_full_collections_and_leave_no_callback():
    bench = load_benchmark()
    before = list(gc.callbacks)
    with bench.GCPauses() as pauses:
        gc.collect()
        out = pauses.take()
        assert out["gc_full_collections"] == 1 and out["gc_s"] > 0
        assert pauses.take() == {"gc_s": 0.0, "gc_full_collections": 0}
    assert gc.callbacks == before


def test_update_only_on_two_ranks_is_data_parallel(tmp_path):
    """Under torchrun each rank updates its own conversations (weak scaling) and the ranks'
    gradients are summed: both ranks' tokens count, the slowest rank's time."""
    import json
    import os
    import subprocess
    import sys

    from memrl.distributed import torchrun_command

    out = tmp_path / "two.json"
    cmd = [*torchrun_command(2, [])[:-2], str(SCRIPT), "--update-only", "--tiny", "--device",
           "cpu", "--samples", "8", "--budgets", "400", "--steps", "2", "--json-out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=str(SCRIPT.parents[1]))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2 and summary["settings"]["samples"] == 8  # per rank
    assert summary["settings"]["tokens_all_ranks"] > summary["settings"]["tokens"]
    row = summary["budgets"][0]
    assert row["update_tokens_per_s"] == pytest.approx(
        summary["settings"]["tokens_all_ranks"] / row["update_s"])
    assert row["update_tokens_per_s_per_gpu"] == pytest.approx(row["update_tokens_per_s"] / 2)


def test_gpu_seconds_per_trajectory_hand_computed():
    bench = load_benchmark()
    mean = {"trajectories_all_ranks": 64.0, "perf/step_time_s": 20.0, "generate_s": 8.0, "sleep_s": 0.5,
            "weight_sync_s": 0.5, "logprob_s": 3.0, "update_s": 6.0, "other_s": 2.0}
    cost = bench.gpu_seconds_per_trajectory(mean, world_size=4)
    assert cost["total"] == pytest.approx(20.0 * 4 / 64)  # 1.25 GPU-s
    assert cost["rollout"] == pytest.approx(0.5) and cost["update"] == pytest.approx(0.375)
    parts = sum(v for k, v in cost.items() if k != "total")
    assert parts == pytest.approx(cost["total"])


def test_scaling_report_efficiencies(tmp_path):
    import json

    spec = importlib.util.spec_from_file_location(
        "scaling_report", SCRIPT.parent / "scaling_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    for n, tok_s in ((1, 1000.0), (2, 1800.0)):
        (tmp_path / f"update_0.5b_gpus{n}.json").write_text(json.dumps({"budgets": [
            {"update_tokens_per_s": tok_s / 2}, {"update_tokens_per_s": tok_s},
            {"error": "out of memory"}]}))
    for n, step_s in ((1, 10.0), (2, 12.5)):  # 32 trajectories per GPU each
        (tmp_path / f"step_0.5b_gpus{n}.json").write_text(json.dumps({
            "mean_excluding_warmup": {"trajectories_all_ranks": 32.0 * n,
                                      "perf/step_time_s": step_s},
            "gpu_seconds_per_trajectory": {"total": step_s * n / (32.0 * n)}}))
    rows = {(r["kind"], r["world_size"]): r for r in report.main([str(tmp_path)])}
    assert rows[("update", 2)]["scaling_efficiency"] == pytest.approx(0.9)
    assert rows[("step", 1)]["scaling_efficiency"] == pytest.approx(1.0)
    assert rows[("step", 2)]["scaling_efficiency"] == pytest.approx(10.0 / 12.5)
    assert rows[("step", 2)]["gpu_seconds_per_trajectory"] == pytest.approx(12.5 / 32)

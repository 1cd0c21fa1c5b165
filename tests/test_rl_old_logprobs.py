"""rl.old_logprobs: on-policy (ppo_epochs 1, one mini-batch) `auto` takes the old log-probs
from the update's own forward instead of a separate pass. On the tiny model in float32 on
CPU, `auto` and `recompute` give the same losses, gradients, parameters after the step and
engine-mismatch metrics (atol 1e-6); the engine guard still stops the update before any
weight changes; off-policy steps still recompute; and several ranks (replicated and FSDP2,
gloo) take the one-process step.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import assert_same_metrics, assert_same_weights, overrides, run_helper
from test_fsdp import exported_weights
from test_recipe_grpo import make_config as recipe_config

from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.distributed import Dist
from memrl.recipes import grpo
from memrl.recipes.config import TrainConfig
from memrl.rl.config import RLConfig
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.maths.correction import LogprobGuard, RolloutMismatchError
from memrl.rl.trainer.actor import Actor
from memrl.run.metrics import read_metrics

ATOL = 1e-6
"""Float32 on CPU: the separate pass and the update's forward are the same computation."""


# ---- which source, per config (pure)
@pytest.mark.parametrize(("settings", "mini_batches", "source"), [
    ({}, 1, "update"),
    ({}, 2, "pass_and_update"),
    ({"old_logprobs": "recompute"}, 2, "pass"),
    ({"ppo_epochs": 2}, 1, "pass"),
    ({"ppo_epochs": 2}, 3, "pass"),
    ({"old_logprobs": "recompute"}, 1, "pass"),
    ({"use_rollout_logprobs": True}, 1, "engine"),
    ({"use_rollout_logprobs": True, "old_logprobs": "recompute"}, 2, "engine"),
    # the reward's KL penalty needs the old log-probs before the update
    ({"use_kl_in_reward": True, "kl_reward_coef": 0.1}, 1, "pass"),
    ({"use_kl_in_reward": True, "kl_reward_coef": 0.0}, 1, "update"),
    # a KL loss, TIS and PPO's critic read them in the update: on-policy is fine
    ({"use_kl_loss": True, "kl_loss_coef": 0.1}, 1, "update"),
    ({"rollout_is": "token"}, 1, "update"),
    ({"adv_estimator": "gae"}, 1, "update"),
])
def test_old_logprob_source(settings, mini_batches, source):
    assert RLConfig(**settings).old_logprob_source(mini_batches) == source


def test_default_is_auto():
    assert RLConfig().old_logprobs == "auto"


# ---- the update: auto vs recompute on one batch
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("onpolicy_data")
    save_records_jsonl(make_synthetic_records(16, num_docs=2, seed=0), d / "train.jsonl")
    save_records_jsonl(make_synthetic_records(3, num_docs=2, seed=1), d / "val.jsonl")
    return d


def make_config(model_dir, data_dir, out_dir, *extra: str) -> TrainConfig:
    """Two questions of 4 samples a step, one mini-batch (on-policy)."""
    return recipe_config(model_dir, data_dir, out_dir, "data.train_batch_size=2",
                         "rl.ppo_mini_batch_size=2", "rollout.n=4", "optim.lr=1e-3",
                         "rl.reward=context_overlap", *extra)


def rollout_batch(run) -> RolloutBatch:
    """A batch of two groups of 4, with advantages of both signs and reference log-probs;
    no old log-probs."""
    trajs = run.task.rollout(run.engine, run.stream.records[:2], num_samples=4, seed=0,
                             temperature=1.0, top_p=1.0)  # as the trainer (TINY_MEMAGENT)
    batch = RolloutBatch.from_trajectories(trajs, overlong="keep")
    ref = run.reference.logprobs(batch) if run.reference is not None else None
    batch = batch.with_logprobs(None, ref)
    return batch.with_advantages(torch.linspace(-1, 1, batch.num_trajectories))


def guard_of(batch: RolloutBatch, shift: float = 0.0, limit: float | None = 1.0) -> LogprobGuard:
    return LogprobGuard([torch.tensor(s.rollout_logprobs) - shift for s in batch.conversations],
                        limit, engine="hf", step=1)


def step(run, batch: RolloutBatch, mode: str):
    """One update of `batch` in `mode`: its stats, its gradients (summed over the
    micro-batches, before clipping), the parameters after the step, the engine mismatch."""
    guard = guard_of(batch)
    mismatch = {}
    if mode == "recompute":
        old, _ = run.actor.logprobs_and_entropy(batch)
        mismatch = guard.check(old, Dist())
        batch = batch.with_logprobs(old, batch.ref_logprobs)
    named = list(run.actor.model.named_parameters())
    grads: dict[str, torch.Tensor] = {}
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p, n=n: grads.__setitem__(n, p.grad.detach().clone())) for n, p in named]
    stats = run.actor.update(batch, guard=guard)
    for hook in hooks:
        hook.remove()
    if mode == "auto":
        mismatch = stats.old_pass.mismatch
    return stats, grads, {n: p.detach().clone() for n, p in named}, mismatch


@pytest.mark.parametrize("extra", [
    ["rl.use_kl_loss=false"],
    ["rl.use_kl_loss=true", "rl.kl_loss_coef=0.1", "rl.rollout_is=token",
     "rl.loss_agg_mode=seq-mean-token-mean", "rl.entropy_coeff=0.01"],
], ids=["plain", "kl-tis-entropy"])
def test_auto_and_recompute_take_the_same_step(tiny_model_dir, data_dir, tmp_path, extra):
    runs = {m: grpo.setup(make_config(tiny_model_dir, data_dir, tmp_path / m, *extra))
            for m in ("auto", "recompute")}
    batch = rollout_batch(runs["auto"])
    start = {n: p.detach().clone() for n, p in runs["auto"].actor.model.named_parameters()}
    a_stats, a_grads, a_params, a_mis = step(runs["auto"], batch, "auto")
    r_stats, r_grads, r_params, r_mis = step(runs["recompute"], batch, "recompute")
    assert a_stats.old_pass is not None and r_stats.old_pass is None
    for key in ("pg_loss", "entropy", "kl_loss", "grad_norm", "ppo_kl", "pg_clipfrac",
                "rollout_is_weight"):
        a, r = getattr(a_stats, key), getattr(r_stats, key)
        assert (a is None) == (r is None), key
        if a is not None:
            assert a == pytest.approx(r, abs=ATOL), key
    assert a_stats.ppo_kl == 0.0 and a_stats.pg_clipfrac == 0.0  # ratio exactly 1
    assert a_grads.keys() == r_grads.keys() and a_grads
    for n in a_grads:
        torch.testing.assert_close(a_grads[n], r_grads[n], atol=ATOL, rtol=0, msg=n)
    moved = max((a_params[n] - start[n]).abs().max().item() for n in start)
    assert moved > 1e-4  # the step did change the weights
    for n in a_params:
        torch.testing.assert_close(a_params[n], r_params[n], atol=ATOL, rtol=0, msg=n)
    assert a_mis.keys() == r_mis.keys() == {"rollout/logprob_diff_mean",
                                            "rollout/logprob_diff_max"}
    for k in a_mis:
        assert a_mis[k] == pytest.approx(r_mis[k], abs=ATOL), k


def test_the_old_pass_of_the_update_is_the_separate_pass(tiny_model_dir, data_dir, tmp_path):
    run = grpo.setup(make_config(tiny_model_dir, data_dir, tmp_path / "r", "optim.lr=1e-12",
                                 "rl.use_kl_loss=false"))
    batch = rollout_batch(run)
    old, ent = run.actor.logprobs_and_entropy(batch)
    stats = run.actor.update(batch)
    taken = stats.old_pass
    assert taken.mismatch == {}  # no guard given
    assert dataclasses.replace(stats, old_pass=None) == stats  # not a metric
    assert not any("old_pass" in k for k in stats.metrics())
    for mine, theirs in ((taken.logprobs, old), (taken.entropy, ent)):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs, strict=True):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_the_guard_stops_the_update_before_any_weight_changes(tiny_model_dir, data_dir,
                                                              tmp_path):
    run = grpo.setup(make_config(tiny_model_dir, data_dir, tmp_path / "r",
                                 "rl.use_kl_loss=false"))
    batch = rollout_batch(run)
    before = {n: p.detach().clone() for n, p in run.actor.model.named_parameters()}
    lr_before = run.actor.lr
    with pytest.raises(RolloutMismatchError, match=r"up to 5 at step 1, above .*=1:"):
        run.actor.update(batch, guard=guard_of(batch, shift=5.0))
    for n, p in run.actor.model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    assert run.actor.optimizer.state == {} and run.actor.lr == lr_before
    # an engine within the bound lets the same update through
    stats = run.actor.update(batch, guard=guard_of(batch, shift=0.5))
    assert stats.old_pass.mismatch["rollout/logprob_diff_max"] == pytest.approx(0.5, abs=1e-4)
    assert any(not torch.equal(p.detach(), before[n])
               for n, p in run.actor.model.named_parameters())


def test_the_guard_checks_every_conversation_before_the_first_of_two_optimizer_steps(
        tiny_model_dir, data_dir, tmp_path):
    """first_on_policy: the pass covered the second mini-batch, the update's forward gives
    the first's; the guard sees both before any weight changes."""
    run = grpo.setup(make_config(tiny_model_dir, data_dir, tmp_path / "r",
                                 "rl.ppo_mini_batch_size=1", "rl.use_kl_loss=false"))
    batch = rollout_batch(run)
    first, second = batch.mini_batches(1)
    full, _ = run.actor.logprobs_and_entropy(batch)
    part, _ = run.actor.logprobs_and_entropy(batch, second)
    assert all(part[i].numel() == 0 for i in first)
    for i in second:
        torch.testing.assert_close(part[i], full[i], atol=ATOL, rtol=0)
    old = [torch.full_like(full[i], float("nan")) if i in first else part[i]
           for i in range(len(full))]
    batch = batch.with_logprobs(old, batch.ref_logprobs)
    before = {n: p.detach().clone() for n, p in run.actor.model.named_parameters()}
    shifted = guard_of(batch)  # the engine off by 5 on the second mini-batch only
    shifted = dataclasses.replace(shifted, engine_logprobs=[
        e - 5.0 if i in second else e for i, e in enumerate(shifted.engine_logprobs)])
    with pytest.raises(RolloutMismatchError, match=r"up to 5 at step 1"):
        run.actor.update(batch, guard=shifted, first_on_policy=True)
    for n, p in run.actor.model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    stats = run.actor.update(batch, guard=guard_of(batch), first_on_policy=True)
    taken = stats.old_pass
    for i in range(len(full)):  # every conversation's old log-probs, the first's from the
        # update's forward (other micro-batches, other padding: float32 sums in another order)
        torch.testing.assert_close(taken.logprobs[i], full[i], atol=ATOL, rtol=1e-5)
    assert all(taken.entropy[i].numel() == len(full[i]) for i in first)
    assert all(taken.entropy[i].numel() == 0 for i in second)
    assert taken.mismatch["rollout/logprob_diff_max"] < 1.0
    with pytest.raises(ValueError, match="first_on_policy needs ppo_epochs 1"):
        run.actor.update(batch.with_logprobs(None, batch.ref_logprobs), first_on_policy=True)


@pytest.mark.parametrize("extra", [["rl.ppo_epochs=2"], ["rl.ppo_mini_batch_size=1"]])
def test_off_policy_updates_need_the_separate_pass(tiny_model_dir, data_dir, tmp_path, extra):
    run = grpo.setup(make_config(tiny_model_dir, data_dir, tmp_path / "r", *extra))
    with pytest.raises(ValueError, match="update needs old log-probs in the batch"):
        run.actor.update(rollout_batch(run))


# ---- the recipe: which pass runs, and the same step either way
def counting(monkeypatch) -> list[float]:
    """Calls of Actor.logprobs_and_entropy (the separate old log-prob pass): the share of
    the batch's conversations each covered."""
    calls: list[float] = []
    original = Actor.logprobs_and_entropy

    def wrapper(self, batch, indices=None):
        n = len(batch.conversations)
        calls.append(1.0 if indices is None else len(indices) / n)
        return original(self, batch, indices)

    monkeypatch.setattr(Actor, "logprobs_and_entropy", wrapper)
    return calls


def one_step(tiny_model_dir, data_dir, out: Path, *extra: str) -> dict:
    cfg = make_config(tiny_model_dir, data_dir, out, "trainer.total_steps=1",
                      "trainer.log_trajectories=true", "trainer.save_freq=1", *extra)
    grpo.train(cfg)
    (row,) = [r for r in read_metrics(out / "metrics.jsonl") if "train/samples" in r]
    return row


@pytest.mark.parametrize(("extra", "passes"), [
    ([], []),
    (["rl.old_logprobs=recompute"], [1.0]),
    (["rl.ppo_epochs=2"], [1.0]),
    (["rl.ppo_mini_batch_size=1"], [0.5]),  # the second question's: the first is on-policy
    (["rl.ppo_mini_batch_size=1", "rl.old_logprobs=recompute"], [1.0]),
    (["rl.use_rollout_logprobs=true"], []),
])
def test_the_separate_pass_runs_only_off_policy_or_when_asked(
        tiny_model_dir, data_dir, tmp_path, monkeypatch, extra, passes):
    calls = counting(monkeypatch)
    row = one_step(tiny_model_dir, data_dir, tmp_path / "r", "rl.use_kl_loss=false", *extra)
    assert calls == passes
    assert ("rollout/logprob_diff_max" in row) == ("rl.use_rollout_logprobs=true" not in extra)


@pytest.mark.parametrize("extra", [
    [],
    ["rl.ppo_mini_batch_size=1"],  # two optimizer steps: the first on-policy, the second not
    ["rl.ppo_mini_batch_size=1", "rl.adv_estimator=gae", "critic.value_model=policy_head",
     "rl.use_kl_loss=true", "rl.kl_loss_coef=0.1"],
], ids=["one-mini-batch", "two-mini-batches", "two-value-head-kl"])
def test_a_step_of_auto_is_a_step_of_recompute(tiny_model_dir, data_dir, tmp_path, extra):
    """The logged metrics (timings aside), the trajectory log (old log-probs and entropies)
    and the checkpointed weights of one recipe step."""
    runs = {m: tmp_path / m for m in ("auto", "recompute")}
    rows = {m: one_step(tiny_model_dir, data_dir, out, f"rl.old_logprobs={m}", *extra)
            for m, out in runs.items()}
    assert_same_metrics(rows["auto"], rows["recompute"])
    logs = {m: (out / "train_trajectories" / "step_000001.jsonl").read_text().splitlines()
            for m, out in runs.items()}
    assert len(logs["auto"]) == len(logs["recompute"]) == 8
    for a, r in zip(logs["auto"], logs["recompute"], strict=True):
        a, r = json.loads(a), json.loads(r)
        for key in ("logprob_mean", "entropy_mean"):
            assert a[key] is not None and a[key] == pytest.approx(r[key], abs=ATOL), key
    weights = {m: load_file(out / "checkpoints" / "step_00000001" / "model" /
                            "model.safetensors") for m, out in runs.items()}
    # One optimizer step: the same weights to float32 precision. Two: the second step's old
    # log-probs come from another pass (other micro-batches, other padding: float32 sums in
    # another order), and Adam's division by sqrt(v) amplifies that noise where gradients
    # are near 0 (measured with torch 2.13.0 / transformers 5.19.0 on the 2-core machine,
    # 2026-11-28: 1.5e-6 without a value head, 1.3e-5 with one, whose first mini-batch's
    # values also come from a pass of their own; lr is 1e-3, so 1e-5 and 3e-5 are noise)
    two_steps = "rl.ppo_mini_batch_size=1" in extra
    atol = (3e-5 if "critic.value_model=policy_head" in extra else 1e-5) if two_steps else ATOL
    assert_same_weights(weights["auto"], weights["recompute"], atol=atol)


# ---- several ranks (gloo): replicated and FSDP2, 3 questions in one mini-batch, or in
# three (the first on-policy: its question on rank 0 only, rank 1's share of it is empty)
RANKS_EXTRA = ["trainer.total_steps=1"]


@pytest.fixture(scope="module")
def one_process_steps(tiny_model_dir, data_dir, tmp_path_factory) -> dict[int, Path]:
    """The one-process runs the strategies are compared with (per mini-batch size: run once)."""
    root = tmp_path_factory.mktemp("old_logprobs_ranks")
    runs = {}
    for mini in (3, 1):
        runs[mini] = root / f"single{mini}"
        run_helper(1, overrides(tiny_model_dir, data_dir, runs[mini], *RANKS_EXTRA,
                                f"rl.ppo_mini_batch_size={mini}"))
    return runs


@pytest.mark.pipeline
@pytest.mark.slow
@pytest.mark.xdist_group("old_logprobs_ranks")  # one worker: `one_process_steps` runs once
@pytest.mark.parametrize(("strategy", "mini"), [("replicate", 3), ("fsdp", 3), ("fsdp", 1)])
def test_ranks_take_the_one_process_step_without_the_pass(tiny_model_dir, data_dir, tmp_path,
                                                         one_process_steps, strategy, mini):
    # 3 questions, one mini-batch (on-policy): rank 0 holds two, rank 1 one, so under FSDP
    # rank 1 runs a padding micro-batch before the guard's all_gather. Three mini-batches:
    # the guard runs after the first, where rank 1 has nothing but padding.
    single, two = one_process_steps[mini], tmp_path / "two"
    run_helper(2, overrides(tiny_model_dir, data_dir, two, *RANKS_EXTRA,
                            f"rl.ppo_mini_batch_size={mini}", f"model.strategy={strategy}"))
    a, b = (read_metrics(d / "metrics.jsonl")[0] for d in (single, two))
    assert_same_metrics(b, a)
    assert "rollout/logprob_diff_max" in a
    step = single / "checkpoints" / "step_00000001"
    mine = load_file(step / "model" / "model.safetensors")
    theirs = (exported_weights(two, 1, tmp_path / "hf") if strategy == "fsdp"
              else load_file(two / "checkpoints" / "step_00000001" / "model" / "model.safetensors"))
    assert_same_weights(theirs, mine)


def test_read_scalars_reads_the_values_exactly():
    from memrl.rl.trainer.averages import read_scalars

    values = [torch.tensor(0.1, dtype=torch.float32), torch.tensor([2.5], dtype=torch.float64),
              torch.tensor(3, dtype=torch.int64), torch.tensor(1e-7, dtype=torch.bfloat16)]
    assert read_scalars(values) == [float(v) for v in values]  # float32 etc. read exactly
    assert read_scalars([]) == []


def test_old_pass_keeps_rows_and_reads_their_response_tokens():
    from memrl.rl.trainer.update_log import OldPass

    old = OldPass([torch.empty(0)] * 3, [torch.empty(0)] * 3, {})
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    response = torch.tensor([[False, True, True], [True, False, False]])
    old.keep([2, 0], response, lp, ent)
    assert old.logprobs[2].numel() == 0  # nothing read before `read`
    old.read()
    assert old.logprobs[2].tolist() == [-2.0, -3.0] and old.logprobs[0].tolist() == [-4.0]
    assert old.entropy[2].tolist() == [2.0, 3.0] and old.entropy[0].tolist() == [4.0]
    assert not old.logprobs[2].requires_grad and old.logprobs[1].numel() == 0
    assert old.pending == []

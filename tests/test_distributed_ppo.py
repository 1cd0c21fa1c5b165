"""PPO with a value model (`rl.adv_estimator: gae`) and REINFORCE++-baseline on several
processes: the batch-wide statistics (whitening, the critic's explained variance) of N
ranks' shares equal one process's on the whole batch (threads standing in for ranks), and
2 ranks under torchrun (gloo, CPU) take the steps one process takes on the same questions:
the same policy and critic weights, the same logged metrics and per-trajectory advantages,
after a resume on 2 ranks too, with the policy and the critic sharded (model.strategy
fsdp), resumed from the sharded checkpoint, and with a value head on the policy
(critic.value_model policy_head).

The torchrun runs use `tests/dist_train.py` (see tests/test_distributed.py).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import assert_same_metrics, overrides, run_helper

from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.rl.maths.advantages import reinforce_pp_baseline_advantages
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.maths.gae import gae_batch, masked_whiten, value_statistics, whitening_stats
from memrl.run.metrics import read_metrics
from memrl.trajectory import Trajectory, Turn

PPO = ["rl.adv_estimator=gae", "rl.lam=0.95", "critic.optim.lr=1e-3"]
# Without dynamic sampling rank 1 holds question 1 of each step (with it, this data's question
# 1 is dropped in step 1 and its refill goes to rank 0: rank 1 would hold nothing).
ONE_ROUND = ["rl.dynamic_sampling=false", "data.val_file=null"]


class ThreadRanks:
    """`n` threads as data-parallel ranks: `reducer(rank)` adds a tensor over them, as
    `Dist.all_reduce_sum` does over processes (each call waits for every rank's)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n)
        self.parts: list[torch.Tensor | None] = [None] * n
        self.calls = [0] * n

    def reducer(self, rank: int):
        def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
            self.calls[rank] += 1
            self.parts[rank] = t.clone()
            self.barrier.wait()
            total = sum(p for p in self.parts)  # the same order on every rank
            self.barrier.wait()
            return total

        return all_reduce_sum

    def run(self, fn) -> list:
        """fn(rank, all_reduce_sum) on every rank at once; the results in rank order."""
        out: list = [None] * self.n
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                out[rank] = fn(rank, self.reducer(rank))
            except BaseException as exc:  # noqa: BLE001 - reraised below
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        if errors:
            raise errors[0]
        return out


def test_whitening_over_ranks_is_the_whitening_of_the_whole_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=g) * 3 + 1
    mask = torch.rand(4, 9, generator=g) < 0.7
    whole = masked_whiten(x, mask)
    # rows 0-1 on rank 0, rows 2-3 on rank 1, and a third rank holding nothing
    shares = [(x[:2], mask[:2]), (x[2:], mask[2:]), (x[:0], mask[:0])]
    ranks = ThreadRanks(3)
    parts = ranks.run(lambda r, reduce: masked_whiten(*shares[r], all_reduce_sum=reduce))
    assert torch.allclose(torch.cat(parts), whole, atol=1e-6, rtol=0)
    assert ranks.calls == [2, 2, 2]  # sum and count, then the squared deviations
    # the statistics themselves, and verl's unbiased variance
    mean, var, n = whitening_stats(x, mask)
    assert int(n) == int(mask.sum())
    assert float(mean) == pytest.approx(float(x[mask].double().mean()), rel=1e-8)  # n + 1e-8
    assert float(var) == pytest.approx(float(x[mask].double().var()), rel=1e-7)
    # fewer than 2 masked values over all ranks: refused on every rank alike
    lone = [(x[:1], torch.eye(1, 9, dtype=torch.bool)), (x[:0], mask[:0])]
    with pytest.raises(ValueError, match="at least 2"):
        ThreadRanks(2).run(lambda r, reduce: masked_whiten(*lone[r], all_reduce_sum=reduce))


def test_value_statistics_over_ranks_are_the_whole_batch_ones():
    g = torch.Generator().manual_seed(1)
    ret, val = torch.randn(30, generator=g), torch.randn(30, generator=g) * 0.5
    ones = torch.ones(30, dtype=torch.bool)
    whole = value_statistics(ret, val, ones)
    assert whole["vf_explained_var"] == pytest.approx(
        float(1 - (ret.double() - val.double()).var() / (ret.double().var() + 1e-5)),
        rel=1e-9)
    cuts = [slice(0, 7), slice(7, 30), slice(30, 30)]
    parts = ThreadRanks(3).run(lambda r, reduce: value_statistics(
        ret[cuts[r]], val[cuts[r]], ones[cuts[r]], all_reduce_sum=reduce))
    for part in parts:
        assert part == pytest.approx(whole, rel=1e-9)


def _trajectories(seed: int, count: int) -> list[Trajectory]:
    """`count` trajectories of 1-3 conversations, two per question, random lengths."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(count):
        turns = []
        for t in range(int(torch.randint(1, 4, (1,), generator=g))):
            n = int(torch.randint(1, 6, (1,), generator=g))
            turns.append(Turn(kind="final", prompt_ids=[5, 6], response_ids=[7] * n,
                              response_logprobs=[-1.0] * n, response_text=""))
        out.append(Trajectory(record_id=f"q{k // 2}", sample_index=k % 2, turns=tuple(turns),
                              reward=float(torch.rand(1, generator=g))))
    return out


def test_gae_batch_over_ranks_gives_the_one_process_advantages():
    trajs = _trajectories(0, 10)
    whole = RolloutBatch.from_trajectories(trajs)
    g = torch.Generator().manual_seed(5)
    values = [torch.randn(len(s.response_ids), generator=g) for s in whole.conversations]
    want = gae_batch(whole.with_values(values), gamma=0.99, lam=0.9)
    # ranks hold whole groups: questions 0, 2, 4 on rank 0, 1 and 3 on rank 1, none on 2
    shares, share_values = [], []
    for rank in range(3):
        mine = [t for t in trajs if int(t.record_id[1:]) % 2 == rank]
        shares.append(RolloutBatch.from_trajectories(mine))
        share_values.append([v for v, s in zip(values, whole.conversations, strict=True)
                             if int(s.group_id[1:]) % 2 == rank])
    got = ThreadRanks(3).run(lambda r, reduce: gae_batch(
        shares[r].with_values(share_values[r]), gamma=0.99, lam=0.9, all_reduce_sum=reduce))
    for rank, part in enumerate(got):
        expect = [a for a, s in zip(want.token_advantages, whole.conversations, strict=True)
                  if int(s.group_id[1:]) % 2 == rank]
        assert len(expect) == len(part.token_advantages)
        for a, b in zip(part.token_advantages, expect, strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)
    assert got[2].token_advantages == ()


def test_reinforce_pp_baseline_over_ranks_is_the_one_process_one():
    g = torch.Generator().manual_seed(2)
    rewards = torch.rand(12, generator=g)
    ids = [f"q{k // 3}" for k in range(12)]
    tokens = torch.randint(1, 20, (12,), generator=g)
    whole = reinforce_pp_baseline_advantages(rewards, ids, token_counts=tokens)
    cuts = [slice(0, 6), slice(6, 12), slice(12, 12)]  # whole groups; rank 2 holds none
    parts = ThreadRanks(3).run(lambda r, reduce: reinforce_pp_baseline_advantages(
        rewards[cuts[r]], ids[cuts[r]], token_counts=tokens[cuts[r]], all_reduce_sum=reduce))
    assert torch.allclose(torch.cat(parts), whole, atol=1e-6, rtol=0)


# ---- 2 ranks under torchrun against one process (the dist_train.py task)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("dist_ppo_data")
    save_records_jsonl(make_synthetic_records(16, num_docs=2, seed=0), d / "train.jsonl")
    save_records_jsonl(make_synthetic_records(3, num_docs=2, seed=1), d / "val.jsonl")
    return d


def _checkpoint(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:08d}"


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _trajectory_rows(run: Path, step: int) -> list[dict]:
    from memrl.run.trajectory_log import read_step_files

    return read_step_files(run)[step]


def _ppo(model_dir: Path, data_dir: Path, out: Path, *extra: str) -> list[str]:
    return overrides(model_dir, data_dir, out, *PPO, *ONE_ROUND, "trainer.keep_last=2", *extra)


# The tests of `ppo_runs` on one xdist worker (scripts/test.sh: --dist loadgroup): split over
# two workers, each ran the module's runs.
ppo_runs_group = pytest.mark.xdist_group("distributed_ppo_runs")


@pytest.fixture(scope="module")
def ppo_runs(tiny_model_dir, data_dir, tmp_path_factory) -> dict[str, Path]:
    """PPO for 2 steps on one process, and step 1 on 2 ranks. 3 questions a step, 2 a
    mini-batch: rank 1 holds nothing of the second mini-batch (its critic adds zeros)."""
    base = tmp_path_factory.mktemp("dist_ppo_runs")
    run_helper(1, _ppo(tiny_model_dir, data_dir, base / "one", "trainer.total_steps=2"))
    run_helper(2, _ppo(tiny_model_dir, data_dir, base / "two", "trainer.total_steps=1"))
    return {"one": base / "one", "two": base / "two"}


def _assert_same_step(one: Path, two: Path, step: int, policy_atol: float = 2e-6) -> None:
    """The policy and the critic after `step`, its metrics (critic/* included) and its
    per-token advantages (the trajectory log's per-trajectory means) are one process's."""
    policy = [load_file(_checkpoint(r, step) / "model" / "model.safetensors") for r in (one, two)]
    critic = [load_file(_checkpoint(r, step) / "critic" / "model.safetensors") for r in (one, two)]
    # AdamW moves each weight by about lr a step: 1e-5 (policy), 1e-3 (critic). Its first
    # steps turn float noise in gradients near its eps (1e-8) into weight differences of a
    # few % of lr: measured 1.2e-7 (policy) and 2e-5 (critic) between 1 and 2 ranks, and
    # 2e-5 (critic) on one process between critic micro-batches of 1 and of 16 samples.
    assert _max_diff(policy[0], policy[1]) < policy_atol
    assert _max_diff(critic[0], critic[1]) < 1e-4
    a = read_metrics(two / "metrics.jsonl")[step - 1]
    b = read_metrics(one / "metrics.jsonl")[step - 1]
    assert a["step"] == b["step"] == step
    assert {"critic/vf_loss", "critic/vf_explained_var", "critic/grad_norm"} <= set(a)
    assert a["critic/vf_loss"] > 0 and a["critic/grad_norm"] > 0
    assert_same_metrics(a, b)  # critic/* and actor/* to 1e-4 relative
    rows = [_trajectory_rows(r, step) for r in (one, two)]
    assert len(rows[1]) == 3 * 2
    for x, y in zip(rows[1], rows[0], strict=True):
        assert (x["id"], x["sample_index"]) == (y["id"], y["sample_index"])
        assert x["advantage"] == pytest.approx(y["advantage"], abs=1e-5)  # measured 6e-8


@pytest.mark.pipeline
@ppo_runs_group
@pytest.mark.slow
def test_ppo_on_two_ranks_takes_the_single_process_step(ppo_runs, tiny_model_dir):
    start = load_file(tiny_model_dir / "model.safetensors")
    policy = load_file(_checkpoint(ppo_runs["one"], 1) / "model" / "model.safetensors")
    assert _max_diff(policy, {k: start[k] for k in policy}) > 5e-6  # it moved by ~lr
    _assert_same_step(ppo_runs["one"], ppo_runs["two"], 1)


@pytest.mark.pipeline
@ppo_runs_group
@pytest.mark.slow
def test_ppo_resumed_on_two_ranks_takes_the_single_process_step(ppo_runs, tiny_model_dir,
                                                                data_dir, tmp_path):
    """Step 2 on 2 ranks from the 2-rank checkpoint of step 1 (written by rank 0; the policy,
    the critic and their optimizers loaded by both ranks: a rank with another critic would
    compute other values, advantages and gradients)."""
    two = tmp_path / "two"
    shutil.copytree(ppo_runs["two"], two)
    run_helper(2, _ppo(tiny_model_dir, data_dir, two, "trainer.total_steps=2",
                       "trainer.resume=auto"))
    _assert_same_step(ppo_runs["one"], two, 2)
    critics = [load_file(_checkpoint(two, s) / "critic" / "model.safetensors") for s in (1, 2)]
    assert _max_diff(*critics) > 5e-4  # the critic's second step moved it by ~lr (1e-3)


def _sharded_critic_weights(run: Path, step: int, config: list[str], tokenizer) -> dict:
    """The whole weights of a checkpoint's sharded critic (critic/sharded/), read into a
    replicated critic on this process."""
    from memrl.config import load_config
    from memrl.recipes import models
    from memrl.recipes.config import TrainConfig
    from memrl.run.checkpoint.critic import load_critic

    critic = models.build_critic(load_config(TrainConfig, None, config), tokenizer,
                                 total_steps=2)
    load_critic(_checkpoint(run, step), critic)
    # on the CPU, as the files it is compared with (on a GPU machine the critic is on CUDA)
    return {k: v.detach().cpu().clone() for k, v in critic.model.state_dict().items()}


@pytest.mark.pipeline
@ppo_runs_group
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP read in one process
def test_ppo_sharded_with_fsdp_on_two_ranks_and_resumed(ppo_runs, tiny_model_dir,
                                                        tiny_tokenizer, data_dir, tmp_path):
    """model.strategy fsdp: the policy and the critic sharded over 2 ranks (each holds half
    of every weight and of its AdamW state), step 1, then step 2 resumed on 2 ranks from the
    sharded checkpoint: each step is still the one-process step (the policy read back by
    export, the critic by loading its shards into a replicated critic; metrics alike)."""
    from memrl.run.checkpoint import export_checkpoint

    fsdp = tmp_path / "fsdp"
    run_helper(2, _ppo(tiny_model_dir, data_dir, fsdp, "trainer.total_steps=1",
                       "model.strategy=fsdp"))
    assert (_checkpoint(fsdp, 1) / "critic" / "sharded" / ".metadata").is_file()
    run_helper(2, _ppo(tiny_model_dir, data_dir, fsdp, "trainer.total_steps=2",
                       "trainer.resume=auto", "model.strategy=fsdp"))
    config = _ppo(tiny_model_dir, data_dir, tmp_path / "unused")
    for step in (1, 2):
        export_checkpoint(_checkpoint(fsdp, step), tmp_path / f"hf{step}")
        policy = load_file(tmp_path / f"hf{step}" / "model.safetensors")
        one = load_file(_checkpoint(ppo_runs["one"], step) / "model" / "model.safetensors")
        assert _max_diff(policy, one) < 2e-6
        critic = _sharded_critic_weights(fsdp, step, config, tiny_tokenizer)
        one = load_file(_checkpoint(ppo_runs["one"], step) / "critic" / "model.safetensors")
        assert _max_diff(critic, one) < 1e-4
        a = read_metrics(fsdp / "metrics.jsonl")[step - 1]
        b = read_metrics(ppo_runs["one"] / "metrics.jsonl")[step - 1]
        assert a["step"] == b["step"] == step and a["critic/grad_norm"] > 0
        assert_same_metrics(a, b)


@pytest.mark.pipeline
@pytest.mark.slow
def test_ppo_with_a_value_head_on_the_policy_on_two_ranks(tiny_model_dir, data_dir, tmp_path):
    """critic.value_model policy_head, replicated: one step on 2 ranks is the one-process
    step (the policy, the head, the metrics with critic/*, the advantages); the head's
    gradients are summed over ranks with the policy's."""
    runs = {}
    for nproc in (1, 2):
        runs[nproc] = tmp_path / f"head_{nproc}"
        run_helper(nproc, _ppo(tiny_model_dir, data_dir, runs[nproc], "trainer.total_steps=1",
                               "critic.value_model=policy_head"))
    head = load_file(_checkpoint(runs[1], 1) / "critic" / "model.safetensors")
    assert set(head) == {"weight", "bias"}
    # The value loss reaches the policy's trunk too, with gradients near AdamW's eps where
    # float noise between 1 and 2 ranks becomes a weight difference of a fraction of lr
    # (1e-5): measured 5.1e-6 with torch 2.13.0 / transformers 5.19.0 on the 2-core machine
    # (2026-11-28; the same at the commit before this session's), within one step's move.
    _assert_same_step(runs[1], runs[2], 1, policy_atol=1e-5)


@pytest.mark.pipeline
@pytest.mark.slow
def test_reinforce_pp_baseline_on_two_ranks_whitens_over_the_whole_step(tiny_model_dir,
                                                                        data_dir, tmp_path):
    """One step of REINFORCE++-baseline on one process and on 2 ranks: the same advantages
    (whitened over every rank's trajectories), metrics and weights."""
    runs = {}
    for nproc in (1, 2):
        runs[nproc] = tmp_path / f"rpp_{nproc}"
        run_helper(nproc, overrides(tiny_model_dir, data_dir, runs[nproc],
                                    "rl.adv_estimator=reinforce_plus_plus_baseline",
                                    *ONE_ROUND, "trainer.total_steps=1"))
    one, two = runs[1], runs[2]
    rows = [_trajectory_rows(r, 1) for r in (one, two)]
    advantages = [torch.tensor([row["advantage"] for row in r]) for r in rows]
    assert advantages[0].abs().max() > 0.1
    assert torch.allclose(advantages[1], advantages[0], atol=1e-5, rtol=0)
    (a,), (b,) = (read_metrics(r / "metrics.jsonl") for r in (two, one))
    assert_same_metrics(a, b)
    weights = [load_file(_checkpoint(r, 1) / "model" / "model.safetensors") for r in (one, two)]
    assert _max_diff(weights[0], weights[1]) < 2e-6

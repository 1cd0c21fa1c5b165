"""Issue 21, item 3: per-trajectory training records (`trainer.log_trajectories`).

Rows by hand from a hand-made batch, the size caps, the config, and a real GRPO run on the
tiny model whose rows carry the trainer's own advantages and let anyone recompute them with
`memrl.rl.maths.advantages` (to 1e-6); `memrl view` lists a step's trajectories.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.recipes import grpo
from memrl.recipes.config import TrainConfig, TrajectoryLogConfig
from memrl.rl.maths.advantages import compute_advantages
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.trainer.actor import Actor
from memrl.run.trajectory_log import (
    TRAJECTORY_DIR,
    TrajectoryLog,
    read_step_files,
    remove_steps_after,
    step_file,
    take_whole_groups,
    trajectory_rows,
)
from memrl.trajectory import Trajectory, Turn


def turn(kind: str, prompt: int, logprobs: list[float], truncated: bool = False) -> Turn:
    return Turn(kind=kind, prompt_ids=list(range(1, prompt + 1)),
                response_ids=list(range(len(logprobs))), response_logprobs=logprobs,
                response_text="x", finish_reason="length" if truncated else "stop")


def hand_batch() -> tuple[list[Trajectory], RolloutBatch, torch.Tensor]:
    trajs = [
        Trajectory("q1", 0, [turn("memory_update", 5, [-1.0, -3.0]), turn("final", 3, [-2.0])],
                   answer="Paris", reward=1.0, metrics={"sub_em": 1.0}),
        Trajectory("q1", 1, [turn("final", 4, [-0.5, -0.5, -2.0], truncated=True)],
                   answer=None, reward=0.0, metrics={"sub_em": 0.0}),
    ]
    batch = RolloutBatch.from_trajectories(trajs, overlong="keep")
    old = [torch.tensor([-1.5, -2.5]), torch.tensor([-2.0]), torch.tensor([-1.0, -1.0, -1.0])]
    task_rewards = batch.rewards
    batch = batch.with_logprobs(old).with_rewards(torch.tensor([0.75, -0.25]))
    batch = batch.with_advantages(torch.tensor([0.5, -0.5]))
    return trajs, batch, task_rewards


def test_rows_by_hand():
    trajs, batch, task_rewards = hand_batch()
    entropies = [torch.tensor([1.0, 2.0]), torch.tensor([4.0]), torch.tensor([0.0, 0.0, 3.0])]
    rows = trajectory_rows(7, trajs, batch, task_rewards, {"q1": ["Paris", "paris"]}, entropies)
    first, second = rows
    assert (first["step"], first["id"], first["sample_index"]) == (7, "q1", 0)
    assert first["reward"] == 1.0 and first["kl_penalty"] == 0.25 and first["advantage"] == 0.5
    assert first["num_conversations"] == 2 and first["answer"] == "Paris"
    assert first["gold"] == ["Paris", "paris"] and first["scores"] == {"sub_em": 1.0}
    assert first["conversations"] == [
        {"kind": "memory_update", "prompt_tokens": 5, "response_tokens": 2, "truncated": False,
         "logprob_mean": -2.0, "rollout_logprob_mean": -2.0, "entropy_mean": 1.5},
        {"kind": "final", "prompt_tokens": 3, "response_tokens": 1, "truncated": False,
         "logprob_mean": -2.0, "rollout_logprob_mean": -2.0, "entropy_mean": 4.0},
    ]
    # token means over the whole trajectory: (-1.5 - 2.5 - 2) / 3 and (1 + 2 + 4) / 3
    assert first["logprob_mean"] == pytest.approx(-2.0)
    assert first["entropy_mean"] == pytest.approx(7 / 3)
    assert second["kl_penalty"] == 0.25 and second["answer"] is None
    assert second["conversations"][0]["truncated"] is True
    assert second["conversations"][0]["rollout_logprob_mean"] == -1.0
    # without the trainer's entropies (rl.use_rollout_logprobs) the entropy is unknown
    bare = trajectory_rows(7, trajs, batch, task_rewards, {})
    assert bare[0]["entropy_mean"] is None and bare[0]["gold"] == []
    assert bare[0]["conversations"][0]["entropy_mean"] is None


def test_take_whole_groups_by_hand():
    rows = [{"id": g} for g in ["a", "a", "b", "b", "b", "c"]]
    assert [r["id"] for r in take_whole_groups(rows, 6)] == ["a", "a", "b", "b", "b", "c"]
    assert [r["id"] for r in take_whole_groups(rows, 5)] == ["a", "a", "b", "b", "b"]
    assert [r["id"] for r in take_whole_groups(rows, 4)] == ["a", "a"]
    assert take_whole_groups(rows, 1) == []


def test_size_caps_and_resume(tmp_path):
    trajs, batch, task_rewards = hand_batch()
    warnings: list[str] = []
    log = TrajectoryLog(tmp_path, max_rows_per_step=8, max_bytes=10_000, gold={},
                        warn=warnings.append)
    for step in (1, 2, 3):
        assert log.write(step, trajs, batch, task_rewards, ["q1"]) == step_file(tmp_path, step)
    assert sorted(read_step_files(tmp_path)) == [1, 2, 3]
    size = step_file(tmp_path, 1).stat().st_size
    remove_steps_after(tmp_path, 1)  # a run resumed from step 1 redoes steps 2 and 3
    assert sorted(read_step_files(tmp_path)) == [1]
    small = TrajectoryLog(tmp_path, max_rows_per_step=8, max_bytes=2 * size + 1, gold={},
                          warn=warnings.append)
    assert small.written_bytes() == size  # what the resumed run already holds
    assert small.write(2, trajs, batch, task_rewards, ["q1"]) is not None
    assert small.write(3, trajs, batch, task_rewards, ["q1"]) is None and small.full
    assert small.write(4, trajs, batch, task_rewards, ["q1"]) is None
    assert warnings == [f"trajectory records stop at step 3: trainer.log_trajectories."
                        f"max_bytes ({2 * size + 1}) reached"]
    one_group = TrajectoryLog(tmp_path / "o", max_rows_per_step=1, max_bytes=10_000, gold={})
    assert one_group.write(1, trajs, batch, task_rewards, ["q1"]) is None  # 2 rows > 1
    assert read_step_files(tmp_path / "o") == {}
    remove_steps_after(tmp_path, -1)
    assert read_step_files(tmp_path) == {}


def test_config_auto_true_false_and_shorthand():
    auto = TrajectoryLogConfig()
    assert auto.active(256) and not auto.active(257)
    assert TrajectoryLogConfig(enabled=True).active(10_000)
    assert not TrajectoryLogConfig(enabled=False).active(1)
    base = ["model.path=m", "data.train_file=t.jsonl"]
    cfg = load_config(TrainConfig, None, [*base, "trainer.log_trajectories=false"])
    assert cfg.trainer.log_trajectories.enabled is False
    cfg = load_config(TrainConfig, None, [*base, "trainer.log_trajectories.max_rows_per_step=4"])
    assert cfg.trainer.log_trajectories.max_rows_per_step == 4
    with pytest.raises(ValidationError, match="not one whole group fits"):
        TrainConfig.model_validate({
            "model": {"path": "m"}, "data": {"train_file": "t"}, "rollout": {"n": 4},
            "trainer": {"log_trajectories": {"enabled": True, "max_rows_per_step": 3}}})


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """Two GRPO steps on the tiny model (dense reward, KL in the reward, std-normalised
    advantages), capturing the batch each update trained on."""
    d = tmp_path_factory.mktemp("trajlog")
    records = make_synthetic_records(6, num_docs=2, seed=3)
    save_records_jsonl(records, d / "train.jsonl")
    cfg = load_config(TrainConfig, None, [
        f"model.path={tiny_model_dir}", f"data.train_file={d / 'train.jsonl'}",
        f"trainer.out_dir={d / 'run'}", "data.train_batch_size=2", "rollout.n=3",
        "rl.ppo_mini_batch_size=2", "rl.reward=context_overlap", "rl.norm_adv_by_std=true",
        "rl.use_kl_in_reward=true", "rl.kl_reward_coef=0.01", "rl.dynamic_sampling=false",
        "memagent.chunk_size=48", "memagent.max_chunks=2", "memagent.max_memory_tokens=6",
        "memagent.max_final_tokens=6", "rollout.temperature=1.0", "rollout.top_p=1.0",
        "rl.overlong=keep", "trainer.total_steps=2", "trainer.log_sinks=[jsonl]",
        "trainer.val_before_train=false", "optim.lr=1e-3",
    ])
    seen: list[RolloutBatch] = []
    update = Actor.update

    def capture(self, batch, *args, **kwargs):
        seen.append(batch)
        return update(self, batch, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Actor, "update", capture)
        grpo.train(cfg)
    return {"dir": d / "run", "config": cfg, "batches": seen,
            "gold": {r.id: r.answers for r in records}}


@pytest.mark.slow
def test_rows_carry_the_trainers_advantages_and_recompute_them(run):
    cfg, steps = run["config"], read_step_files(run["dir"])
    assert sorted(steps) == [1, 2]
    for step, batch in zip((1, 2), run["batches"], strict=True):
        rows = steps[step]
        assert len(rows) == cfg.data.train_batch_size * cfg.rollout.n
        assert [(r["id"], r["sample_index"]) for r in rows] == [
            (g, i) for g in dict.fromkeys(batch.group_ids) for i in range(cfg.rollout.n)]
        # the trainer's advantages, row by row
        for row, adv, reward in zip(rows, batch.advantages, batch.rewards, strict=True):
            assert row["step"] == step and math.isclose(row["advantage"], float(adv),
                                                        abs_tol=1e-7)
            assert math.isclose(row["reward"] - row["kl_penalty"], float(reward), abs_tol=1e-6)
        # ... and recomputed from the rows alone with memrl.rl.maths.advantages
        again = compute_advantages(
            cfg.rl.adv_estimator,
            torch.tensor([r["reward"] - r["kl_penalty"] for r in rows]),
            [r["id"] for r in rows],
            token_counts=torch.tensor([sum(c["response_tokens"] for c in r["conversations"])
                                       for r in rows]),
            norm_by_std=cfg.rl.norm_adv_by_std, size1=cfg.rl.size1_group_advantage)
        got = torch.tensor([r["advantage"] for r in rows])
        assert torch.allclose(again.double(), got.double(), atol=1e-6, rtol=0)
        assert got.abs().max() > 0.1  # a real signal, not all zeros
        for row in rows:
            assert row["gold"] == run["gold"][row["id"]]
            assert row["num_conversations"] == len(row["conversations"]) >= 2
            assert row["conversations"][-1]["kind"] == "final"
            assert row["entropy_mean"] > 0 and row["logprob_mean"] < 0
    # step 1 samples the reference itself (KL 0); step 2's policy has moved
    assert all(r["kl_penalty"] == 0 for r in steps[1])
    assert any(r["kl_penalty"] != 0 for r in steps[2])


@pytest.mark.slow
def test_view_lists_a_steps_trajectories(run, capsys):
    assert cli_main(["view", str(run["dir"]), "steps=[1]"]) == 0
    page = (run["dir"] / "view.html").read_text()
    assert page.count('<details class="step"') == 1 and 'data-step="1"' in page
    assert "steps 1 of 2 logged" in page
    rows = read_step_files(run["dir"])[1]
    body = page.split('data-step="1"', 1)[1]
    assert body.count("<tr><td>") == len(rows)
    assert all(r["id"] in body for r in rows)
    assert cli_main(["view", str(run["dir"])]) == 0
    page = (run["dir"] / "view.html").read_text()
    assert page.count('<details class="step"') == 2 and 'data-step="2" open' in page
    assert "train: ok" not in page  # grpo.train itself writes no run record (the CLI does)
    assert (run["dir"] / TRAJECTORY_DIR).is_dir()

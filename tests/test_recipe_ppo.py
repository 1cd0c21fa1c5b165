"""PPO with a value model (`rl.adv_estimator: gae`) on the tiny model (CPU): the critic, its
exact micro-batching, the batch's per-token advantages, checkpoint and resume, refusals, and
the quickstart's task learned with `memrl train configs/quickstart.yaml rl.adv_estimator=gae`.
On several processes: tests/test_distributed_ppo.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import TINY_MEMAGENT

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.metrics import read_metrics
from memrl.recipes import grpo, models
from memrl.recipes.config import TrainConfig
from memrl.rl.batch import RolloutBatch
from memrl.rl.checkpoint.critic import load_critic
from memrl.rl.gae import gae_batch
from memrl.trajectory import Trajectory, Turn

CRITIC_KEYS = {"critic/vf_loss", "critic/vf_explained_var", "critic/vf_clipfrac",
               "critic/returns_mean", "critic/values_mean", "critic/vpred_mean",
               "critic/grad_norm", "critic/lr"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ppo_data")
    save_records_jsonl(make_synthetic_records(12, num_docs=2, seed=0), d / "train.jsonl")
    return d


def make_config(model_dir, data_dir, out_dir, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, [
        f"model.path={model_dir}", f"data.train_file={data_dir / 'train.jsonl'}",
        f"trainer.out_dir={out_dir}", *TINY_MEMAGENT, "trainer.log_sinks=[jsonl]",
        "rl.adv_estimator=gae", "rl.reward=context_overlap", "rl.use_kl_loss=false",
        "rl.dynamic_sampling=false", "data.train_batch_size=2", "rl.ppo_mini_batch_size=1",
        "rollout.n=2", "rl.lam=0.95", "critic.optim.lr=1e-3", *extra,
    ])


def two_trajectories() -> list[Trajectory]:
    """Trajectory a: two conversations (3 + 2 response tokens), b: one (4 tokens)."""
    def turn(kind, prompt, response):
        return Turn(kind=kind, prompt_ids=prompt, response_ids=response,
                    response_logprobs=[-1.0] * len(response), response_text="")

    return [
        Trajectory(record_id="a", turns=(turn("memory_update", [5, 6, 7], [8, 9, 10]),
                                         turn("final", [11, 12], [13, 14])), reward=1.0),
        Trajectory(record_id="b", turns=(turn("final", [5, 6], [20, 21, 22, 23]),), reward=0.0),
    ]


def test_gae_batch_gives_every_token_its_advantage_and_return():
    batch = RolloutBatch.from_trajectories(two_trajectories())
    values = [torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.4, 0.5]),
              torch.tensor([0.6, 0.7, 0.8, 0.9])]
    out = gae_batch(batch.with_values(values), gamma=1.0, lam=1.0)
    # gamma = lam = 1: return = the trajectory's reward at every token of every conversation
    assert torch.allclose(torch.cat(out.returns), torch.tensor([1.0] * 5 + [0.0] * 4))
    raw = torch.cat([1.0 - values[0], 1.0 - values[1], 0.0 - values[2]])
    whitened = (raw - raw.mean()) / raw.std()
    assert torch.allclose(torch.cat(out.token_advantages), whitened, atol=1e-5)
    # the per-trajectory summary is the mean over its tokens; collate places the tokens' own
    assert torch.allclose(out.advantages, torch.stack([whitened[:5].mean(), whitened[5:].mean()]))
    tensors = out.collate([0, 2], pad_id=0)
    assert torch.allclose(tensors["advantages"][0, 2:5], whitened[:3])
    assert torch.allclose(tensors["values"][1, 1:5], values[2])
    assert torch.allclose(tensors["returns"][1][tensors["response_mask"][1]], torch.zeros(4))


def test_critic_update_is_exact_over_micro_batches(tiny_model_dir, tiny_tokenizer, data_dir,
                                                   tmp_path):
    """The same mini-batch cut into micro-batches of 1 or of all samples: the same loss and
    the same gradient (its norm before clipping)."""
    batch = RolloutBatch.from_trajectories(two_trajectories())
    trained = []
    for size in (1, 8):
        torch.manual_seed(0)
        cfg = make_config(tiny_model_dir, data_dir, tmp_path, "rl.use_dynamic_bsz=false",
                          f"critic.micro_batch_size={size}", "rl.ppo_mini_batch_size=2")
        critic = models.build_critic(cfg, tiny_tokenizer, total_steps=1)
        values = critic.values(batch)
        assert [v.shape for v in values] == [(3,), (2,), (4,)]
        stats = critic.update(gae_batch(batch.with_values(values), gamma=1.0, lam=0.9))
        assert set(stats.metrics()) == CRITIC_KEYS
        trained.append(stats)
    one, whole = trained
    assert one.vf_loss == pytest.approx(whole.vf_loss, rel=1e-5)
    assert one.grad_norm == pytest.approx(whole.grad_norm, rel=1e-5)
    assert one.vf_loss > 0 and one.grad_norm > 0


def test_the_critic_learns_the_returns(tiny_model_dir, tiny_tokenizer, data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, data_dir, tmp_path, "critic.optim.lr=1e-2",
                      "rl.ppo_mini_batch_size=2")
    critic = models.build_critic(cfg, tiny_tokenizer, total_steps=1)
    batch = RolloutBatch.from_trajectories(two_trajectories())
    losses = []
    for _ in range(15):
        batch = gae_batch(batch.with_values(critic.values(batch)), gamma=1.0, lam=1.0)
        losses.append(critic.update(batch).vf_loss)
    assert losses[-1] < 0.2 * losses[0], losses


def test_a_checkpoint_without_a_critic_is_refused(tiny_model_dir, tiny_tokenizer, data_dir,
                                                  tmp_path):
    cfg = make_config(tiny_model_dir, data_dir, tmp_path)
    critic = models.build_critic(cfg, tiny_tokenizer, total_steps=1)
    with pytest.raises(MemrlInputError, match="not trained with rl.adv_estimator=gae"):
        load_critic(tmp_path, critic)


def test_gae_allows_one_trajectory_per_question(tiny_model_dir, data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, data_dir, tmp_path, "rollout.n=1")
    assert cfg.rollout.n == 1
    with pytest.raises(MemrlInputError, match="rollout.n=1"):
        make_config(tiny_model_dir, data_dir, tmp_path, "rollout.n=1",
                    "rl.adv_estimator=grpo")


def test_resume_restores_the_critic(tiny_model_dir, data_dir, tmp_path):
    """3 steps straight, or 2 steps then a resumed third: the third step's metrics (the
    critic's included) are the same, so the critic, its optimizer and schedule were saved
    and loaded."""
    grpo.train(make_config(tiny_model_dir, data_dir, tmp_path / "ref",
                           "trainer.total_steps=3"))
    grpo.train(make_config(tiny_model_dir, data_dir, tmp_path / "cut", "trainer.total_steps=2"))
    ckpt = tmp_path / "cut" / "checkpoints" / "step_00000002"
    assert (ckpt / "critic" / "model.safetensors").is_file()
    grpo.train(make_config(tiny_model_dir, data_dir, tmp_path / "cut", "trainer.total_steps=3",
                           "trainer.resume=auto"))
    want = read_metrics(tmp_path / "ref" / "metrics.jsonl")[-1]
    got = read_metrics(tmp_path / "cut" / "metrics.jsonl")[-1]
    assert got["step"] == want["step"] == 3
    assert CRITIC_KEYS <= set(got)
    for key in sorted(want):
        if key.startswith(("critic/", "actor/", "train/")):
            assert math.isclose(got[key], want[key], rel_tol=1e-6, abs_tol=1e-9), key


@pytest.mark.slow
def test_ppo_learns_the_quickstart_task(tmp_path):
    """`memrl train configs/quickstart.yaml rl.adv_estimator=gae ...` on the quickstart's own
    model and synthetic data, from the untrained model, with seeds 0 and 1. The reward is the
    dense share of answer tokens found in the document (context_overlap): the quickstart's
    sub-EM is 0 for an untrained model until the warm start, which is another 90 s.
    The measured rewards, with the commands that give them: docs/algorithms.md."""
    from memrl.quickstart import QuickstartPlan, prepare_quickstart

    paths = [f"model.path={tmp_path / 'model'}", f"data.train_file={tmp_path / 'train.jsonl'}"]
    cfg = load_config(TrainConfig, "configs/quickstart.yaml",
                      [*paths, f"data.val_file={tmp_path / 'val.jsonl'}"])
    prepare_quickstart(cfg, plan=QuickstartPlan(eval_docs=(4,), eval_questions=4,
                                                train_questions=400))
    steps, gains = 10, []
    for seed in (0, 1):
        out = tmp_path / f"rl_{seed}"
        code = cli_main([
            "train", "configs/quickstart.yaml", *paths, f"trainer.out_dir={out}",
            f"seed={seed}", "rl.adv_estimator=gae", "rl.reward=context_overlap",
            "rl.overlong=keep", "rl.dynamic_sampling=false", "rollout.n=4",
            "data.train_batch_size=4", "rl.ppo_mini_batch_size=4", "optim.lr=1e-2",
            "critic.optim.lr=1e-3", f"trainer.total_steps={steps}",
            "trainer.val_before_train=false", "data.val_file=null", "trainer.log_sinks=[jsonl]",
        ])
        assert code == 0
        rows = [r for r in read_metrics(out / "metrics.jsonl") if "step" in r]
        assert len(rows) == steps
        for r in rows:
            assert CRITIC_KEYS <= set(r) and all(math.isfinite(r[k]) for k in CRITIC_KEYS), r
        rewards = [r["train/reward_mean"] for r in rows]
        gains.append(sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3)
        assert gains[-1] > 0, (seed, rewards)
        assert (out / "checkpoints" / f"step_{steps:08d}" / "critic").is_dir()
    assert sum(gains) / len(gains) > 0.05, gains


def test_critic_init_from_a_path_and_a_missing_one(tiny_model_dir, tiny_tokenizer, data_dir,
                                                    tmp_path):
    cfg = make_config(tiny_model_dir, data_dir, tmp_path, f"critic.init={tiny_model_dir}")
    critic = models.build_critic(cfg, tiny_tokenizer, total_steps=1)
    assert critic is not None and critic.model.head.out_features == 1
    cfg = make_config(tiny_model_dir, data_dir, tmp_path, f"critic.init={tmp_path / 'none'}")
    with pytest.raises(MemrlInputError, match="none"):
        models.build_critic(cfg, tiny_tokenizer, total_steps=1)
    grpo_cfg = make_config(tiny_model_dir, data_dir, tmp_path, "rl.adv_estimator=grpo")
    assert models.build_critic(grpo_cfg, tiny_tokenizer, total_steps=1) is None

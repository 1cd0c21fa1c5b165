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
from memrl.recipes import grpo, models
from memrl.recipes.config import TrainConfig
from memrl.rl.maths.batch import RolloutBatch
from memrl.rl.maths.gae import gae_batch
from memrl.run.checkpoint.critic import load_critic
from memrl.run.metrics import read_metrics
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


@pytest.mark.pipeline
@pytest.mark.slow
def test_ppo_learns_the_quickstart_task(tmp_path):
    """`memrl train configs/quickstart.yaml rl.adv_estimator=gae ...` on the quickstart's own
    model and synthetic data, from the untrained model, with seeds 0 and 1. The reward is the
    dense share of answer tokens found in the document (context_overlap): the quickstart's
    sub-EM is 0 for an untrained model until the warm start, which is another 90 s.
    The measured rewards, with the commands that give them: docs/algorithms.md."""
    from memrl.apps.quickstart import QuickstartPlan, prepare_quickstart

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


# ---- critic.value_model: policy_head (a value head on the policy, one joint loss)


def test_a_value_head_on_the_policy_steps_by_the_joint_loss(tiny_model_dir):
    """One update of the actor with a value head (SGD of lr 1, no clipping: every weight
    moves by minus its gradient) is the step of pg_loss + vf_coef · vf_loss, computed here by
    hand at ratio 1 from the batch's own numbers: pg = -mean(A) and vf = mean((V - R)²) / 2
    over the loss tokens. The head gets vf_coef · ∇vf; the shared body ∇pg + vf_coef · ∇vf."""
    import copy

    from memrl.inference.loader import load_model
    from memrl.rl.config import RLConfig
    from memrl.rl.trainer.actor import Actor, response_pass
    from memrl.rl.trainer.values import PolicyValueHead, value_head

    coef = 0.3
    torch.manual_seed(0)
    model = load_model(tiny_model_dir, device="cpu", dtype=torch.float32)
    head = value_head(model.config.hidden_size)
    optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=1.0)
    actor = Actor(model, RLConfig(use_kl_loss=False, ppo_mini_batch_size=2),
                  optimizer=optimizer, grad_clip=1e9, pad_id=0,
                  scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                  value_head=PolicyValueHead(head, vf_coef=coef, cliprange_value=0.5))
    batch = RolloutBatch.from_trajectories(two_trajectories())
    old, _, values = actor.logprobs_entropy_and_values(batch)
    assert [v.shape for v in values] == [(3,), (2,), (4,)]
    batch = gae_batch(batch.with_values(values).with_logprobs(old, None), gamma=1.0, lam=0.9)

    # by hand, on copies: the two losses and their gradients
    body, own_head = copy.deepcopy(model), copy.deepcopy(head)
    tensors = batch.collate([0, 1, 2], pad_id=0)
    mask = tensors["loss_mask"]
    lp, _, v = response_pass(body, tensors, value_head=own_head)
    n = mask.sum()
    ratio = torch.exp(lp - tensors["old_logprobs"])  # 1, with the policy's gradient
    pg = -(ratio * tensors["advantages"] * mask).sum() / n
    vf = 0.5 * (((v - tensors["returns"]) ** 2) * mask).sum() / n
    returns, old_values = torch.cat(batch.returns), torch.cat(batch.values)
    assert float(vf.detach()) == pytest.approx(0.5 * float(((old_values - returns) ** 2).mean()),
                                      rel=1e-5)
    pg.backward(retain_graph=True)
    pg_only = {k: p.grad.clone() for k, p in body.named_parameters()}
    (coef * vf).backward()
    want_body = {k: p.grad for k, p in body.named_parameters()}
    want_head = {k: p.grad for k, p in own_head.named_parameters()}

    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    head_before = {k: p.detach().clone() for k, p in head.named_parameters()}
    stats = actor.update(batch)
    assert stats.pg_loss == pytest.approx(float(pg.detach()), abs=1e-6)
    assert stats.pg_loss == pytest.approx(-float(torch.cat(batch.token_advantages).mean()),
                                          abs=1e-6)
    assert stats.critic is not None and set(stats.critic.metrics()) == CRITIC_KEYS
    assert stats.critic.vf_loss == pytest.approx(float(vf.detach()), rel=1e-5)
    assert not set(stats.metrics()) & CRITIC_KEYS  # critic/* come from stats.critic
    for k, p in head.named_parameters():
        moved = head_before[k] - p.detach()
        assert torch.allclose(moved, want_head[k], atol=1e-6, rtol=1e-4), k
        assert moved.abs().max() > 0
    worst = max(float((before[k] - p.detach() - want_body[k]).abs().max())
                for k, p in model.named_parameters())
    assert worst < 1e-5
    from_vf = max(float((want_body[k] - pg_only[k]).abs().max()) for k in pg_only)
    assert from_vf > 100 * worst  # the value loss reaches the body


def test_policy_head_options_are_checked(tiny_model_dir, data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, data_dir, tmp_path, "critic.value_model=policy_head")
    assert cfg.critic.vf_coef == 0.1 and cfg.critic.value_model == "policy_head"
    with pytest.raises(MemrlInputError, match="critic.value_model=separate"):
        make_config(tiny_model_dir, data_dir, tmp_path, "critic.value_model=policy_head",
                    "model.strategy=fsdp")
    with pytest.raises(MemrlInputError, match="critic.init, critic.micro_batch_size"):
        make_config(tiny_model_dir, data_dir, tmp_path, "critic.value_model=policy_head",
                    f"critic.init={tiny_model_dir}", "critic.micro_batch_size=2")
    with pytest.raises(MemrlInputError, match="critic.value_model"):
        make_config(tiny_model_dir, data_dir, tmp_path, "critic.value_model=shared")
    with pytest.raises(MemrlInputError, match="critic.vf_coef"):
        make_config(tiny_model_dir, data_dir, tmp_path, "critic.vf_coef=0")


def test_policy_head_trains_resumes_and_exports_a_plain_model(tiny_model_dir, data_dir,
                                                              tmp_path):
    """critic.value_model policy_head: 3 steps straight, or 2 then a resumed third, log the
    same third step (critic/* included: the head's weights and its AdamW state in the
    actor's optimizer were saved and loaded); `memrl export` writes the plain causal LM,
    the head stays in the checkpoint's critic/. Two mini-batches a step: the values come from
    the old log-prob pass."""
    from safetensors.torch import load_file

    head = ["critic.value_model=policy_head"]
    grpo.train(make_config(tiny_model_dir, data_dir, tmp_path / "ref", *head,
                           "trainer.total_steps=3"))
    grpo.train(make_config(tiny_model_dir, data_dir, tmp_path / "cut", *head,
                           "trainer.total_steps=2"))
    ckpt = tmp_path / "cut" / "checkpoints" / "step_00000002"
    assert set(load_file(ckpt / "critic" / "model.safetensors")) == {"weight", "bias"}
    assert not (ckpt / "critic" / "optimizer.pt").exists()
    grpo.train(make_config(tiny_model_dir, data_dir, tmp_path / "cut", *head,
                           "trainer.total_steps=3", "trainer.resume=auto"))
    want = read_metrics(tmp_path / "ref" / "metrics.jsonl")[-1]
    got = read_metrics(tmp_path / "cut" / "metrics.jsonl")[-1]
    assert got["step"] == want["step"] == 3
    assert CRITIC_KEYS <= set(got) and got["critic/vf_loss"] > 0
    assert got["critic/lr"] == pytest.approx(1e-3)
    for key in sorted(want):
        if key.startswith(("critic/", "actor/", "train/")):
            assert math.isclose(got[key], want[key], rel_tol=1e-6, abs_tol=1e-9), key
    assert cli_main(["export", str(tmp_path / "cut"), str(tmp_path / "hf")]) == 0
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(exported) <= set(load_file(tiny_model_dir / "model.safetensors"))


def test_policy_head_on_policy_step_takes_a_values_pass(tiny_model_dir, data_dir, tmp_path):
    """One mini-batch a step (on-policy: the update gives the old log-probs), so the values
    take a pass of their own; in padded and in packed micro-batches (rl.remove_padding) the
    step is the same."""
    rows = {}
    for packed in ("false", "true"):
        out = tmp_path / f"packed_{packed}"
        grpo.train(make_config(tiny_model_dir, data_dir, out, "critic.value_model=policy_head",
                               "rl.ppo_mini_batch_size=2", "trainer.total_steps=1",
                               f"rl.remove_padding={packed}"))
        (rows[packed],) = read_metrics(out / "metrics.jsonl")
    for row in rows.values():
        assert CRITIC_KEYS <= set(row) and all(math.isfinite(row[k]) for k in CRITIC_KEYS)
        assert row["critic/vf_loss"] > 0 and row["critic/grad_norm"] > 0
    for key in ("critic/vf_loss", "critic/values_mean", "critic/grad_norm", "actor/pg_loss",
                "actor/grad_norm"):
        assert rows["true"][key] == pytest.approx(rows["false"][key], rel=1e-4, abs=1e-6), key

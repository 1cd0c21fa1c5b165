"""The recipe's choices that verl makes too, each against hand or verl values: lr warmup,
config refusals, sampling seeds across refill rounds, response-only logits."""

from __future__ import annotations

import pytest
import torch

from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.inference.base import batch_params, request_params
from memrl.inference.loader import load_model
from memrl.recipes import grpo
from memrl.recipes.config import TrainConfig
from memrl.rl.maths.batch import Conversation, collate
from memrl.rl.maths.losses import logprobs_from_logits
from memrl.rl.trainer.actor import build_optimizer, response_logprobs, warmup_schedule
from memrl.run.metrics import read_metrics


def config(tmp_path, *extra):
    return load_config(TrainConfig, None, [
        "model.path=m", f"data.train_file={tmp_path / 'train.jsonl'}", *extra,
    ])


# ---------------------------------------------------------------- learning-rate warmup
def test_warmup_schedule_is_verls():
    """verl get_constant_schedule_with_warmup with W = 3: lr x 0, 1/3, 2/3, 1, 1."""
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, lr=0.3, betas=(0.9, 0.99), weight_decay=0.0)
    sched = warmup_schedule(opt, 3)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.3])
    opt = build_optimizer(model, lr=0.3, betas=(0.9, 0.99), weight_decay=0.0)
    warmup_schedule(opt, 0)
    assert opt.param_groups[0]["lr"] == 0.3  # no warmup: the full lr from the first step


def test_cosine_schedule_is_verls():
    """verl get_cosine_schedule_with_warmup, W = 2, T = 6, min_lr_ratio m = 0.1, lr 1:
    warmup m + (1 - m) s / W = 0.1, 0.55; then (1 + m)/2 + (1 - m)/2 cos(pi (s - W)/(T - W))
    = 1, 0.55 + 0.45 cos(pi/4) = 0.868198, 0.55, 0.231802, 0.1; held at m after T."""
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, lr=1.0, betas=(0.9, 0.99), weight_decay=0.0)
    sched = warmup_schedule(opt, 2, kind="cosine", total_steps=6, min_lr_ratio=0.1)
    seen = []
    for _ in range(9):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.1, 0.55, 1.0, 0.868198, 0.55, 0.231802, 0.1, 0.1, 0.1],
                                 abs=1e-6)
    with pytest.raises(ValueError, match="total_steps"):
        warmup_schedule(opt, 2, kind="cosine")
    with pytest.raises(ValueError, match="unknown lr schedule"):
        warmup_schedule(opt, 2, kind="linear")


def lr_logging_run(tiny_model_dir, tmp_path, *extra):
    """A few tiny GRPO steps whose metrics log train/lr (8 two-document questions)."""
    save_records_jsonl(make_synthetic_records(8, num_docs=2, seed=0), tmp_path / "train.jsonl")
    return config(
        tmp_path, f"model.path={tiny_model_dir}", f"trainer.out_dir={tmp_path / 'run'}",
        "trainer.log_sinks=[jsonl]", "data.train_batch_size=1",
        "rl.ppo_mini_batch_size=1", "rollout.n=2", "rl.dynamic_sampling=false",
        "rl.use_kl_loss=false", "memagent.chunk_size=64", "memagent.max_chunks=1",
        "memagent.max_memory_tokens=4", "memagent.max_final_tokens=4", *extra,
    )


def test_cosine_schedule_spans_the_run_in_train_and_sft(tiny_model_dir, tmp_path):
    """optim.lr_scheduler=cosine decays to lr * min_lr_ratio at trainer.total_steps, in both
    recipes (the logged train/lr is the lr each step used)."""
    from memrl.recipes import sft
    from memrl.recipes.sft_config import SFTConfig

    cfg = lr_logging_run(tiny_model_dir, tmp_path, "trainer.total_steps=3", "optim.lr=0.04",
                         "optim.lr_scheduler=cosine", "optim.min_lr_ratio=0.25")
    grpo.train(cfg)
    lrs = [r["train/lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    # no warmup, T = 3: (1 + m)/2 + (1 - m)/2 cos(pi s / 3) with m = 0.25 → 1, 0.8125, 0.4375
    assert lrs == pytest.approx([0.04, 0.0325, 0.0175])
    scfg = load_config(SFTConfig, None, [
        f"model.path={tiny_model_dir}", f"data.train_file={tmp_path / 'train.jsonl'}",
        f"trainer.out_dir={tmp_path / 'sft'}", "trainer.total_steps=3", "sft.batch_size=2",
        "trainer.log_sinks=[jsonl]", "trainer.val_before_train=false", "optim.lr=0.04",
        "optim.lr_scheduler=cosine", "optim.min_lr_ratio=0.25", "memagent.chunk_size=64",
    ])
    sft.train(scfg)
    lrs = [r["train/lr"] for r in read_metrics(tmp_path / "sft" / "metrics.jsonl")]
    assert lrs == pytest.approx([0.04, 0.0325, 0.0175])


def test_train_lr_logs_the_lr_each_step_used(tiny_model_dir, tmp_path):
    cfg = lr_logging_run(tiny_model_dir, tmp_path, "trainer.total_steps=4", "optim.lr=0.03",
                         "optim.warmup_steps=3")
    grpo.train(cfg)
    lrs = [r["train/lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert lrs == pytest.approx([0.0, 0.01, 0.02, 0.03])


# ---------------------------------------------------------------- config refusals
def test_groups_of_one_are_a_config_error_unless_verls_raw_reward_is_asked(tmp_path):
    with pytest.raises(MemrlInputError, match="rollout.n=1 makes groups of one"):
        config(tmp_path, "rollout.n=1")
    with pytest.raises(MemrlInputError, match="dynamic_sampling"):
        config(tmp_path, "rollout.n=1", "rl.size1_group_advantage=raw_reward")
    cfg = config(tmp_path, "rollout.n=1", "rl.size1_group_advantage=raw_reward",
                 "rl.dynamic_sampling=false")
    assert cfg.rollout.n == 1


def test_half_precision_full_fine_tuning_is_refused(tmp_path):
    with pytest.raises(MemrlInputError, match="AdamW updates of half-precision weights"):
        config(tmp_path, "model.dtype=bfloat16")
    cfg = config(tmp_path, "model.dtype=bfloat16", "model.lora.enabled=true")
    assert cfg.model.dtype == "bfloat16"


def test_rl_defaults_and_refusals_follow_verl(tmp_path):
    cfg = config(tmp_path)
    assert cfg.rl.clip_ratio_c == 3.0 and cfg.rl.kl_penalty == "k1"
    assert cfg.rl.kl_loss_type == "low_var_kl"
    with pytest.raises(MemrlInputError, match="loss_scale_factor"):
        config(tmp_path, "rl.loss_agg_mode=seq-mean-token-sum-norm")
    cfg = config(tmp_path, "rl.loss_agg_mode=seq-mean-token-sum-norm", "rl.loss_scale_factor=512")
    assert cfg.rl.loss_scale_factor == 512
    for bad in ("optim.betas=[0.9, 1.0]", "optim.lr=.nan", "rl.clip_ratio_high=.inf",
                "seed=-1", "model.device=tpu:0"):
        with pytest.raises(MemrlInputError):
            config(tmp_path, bad)


# ---------------------------------------------------------------- seeds
def test_sampling_seeds_never_repeat_within_a_step(tiny_model_dir, tmp_path):
    """With every group uninformative, a step rolls out 1 + max_refill_rounds rounds; no two
    requests of the step (any round, question, sample or turn) share a seed, and neither do
    the generate calls the HF engine seeds as a whole."""
    save_records_jsonl(make_synthetic_records(8, num_docs=2, seed=0), tmp_path / "train.jsonl")
    cfg = config(
        tmp_path, f"model.path={tiny_model_dir}", f"trainer.out_dir={tmp_path / 'run'}",
        "data.train_batch_size=2", "rl.ppo_mini_batch_size=2", "rollout.n=2",
        "rl.dynamic_sampling=true", "rl.max_refill_rounds=3", "rl.use_kl_loss=false",
        "rl.reward=em", "memagent.chunk_size=32", "memagent.max_chunks=3",
        "memagent.max_memory_tokens=3", "memagent.max_final_tokens=3",
    )
    run = grpo.setup(cfg)
    seeds = []
    generate = run.engine.generate

    calls = []

    def recording(prompts, params):
        seeds.extend(p.seed for p in request_params(prompts, params))
        calls.append(batch_params(prompts, params).seed)
        return generate(prompts, params)

    run.engine.generate = recording
    metrics = grpo.train_step(run)
    assert metrics["train/groups_generated"] == 2 * 4  # four rounds: nothing informative
    assert len(calls) > 8 and len(set(calls)) == len(calls)
    assert len(seeds) > 2 * 4 * 2 * 2 and len(set(seeds)) == len(seeds)


# ---------------------------------------------------------------- logits at responses only
def test_response_logprobs_equal_a_full_forward(tiny_model_dir):
    model = load_model(tiny_model_dir)
    samples = [Conversation(list(range(3, 40)), [7, 8, 9, 2], [0.0] * 4, 0, "g", 0, "final"),
               Conversation([5, 6], [11, 12], [0.0] * 2, 1, "g", 0, "final")]
    t = collate(samples, pad_id=0)
    with torch.no_grad():
        got, ent = response_logprobs(model, t, temperature=0.7, with_entropy=True)
        logits = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                       position_ids=t["position_ids"]).logits
        full = logprobs_from_logits(logits, t["labels"], temperature=0.7)
    mask = t["response_mask"]
    torch.testing.assert_close(got[mask], full[mask], rtol=1e-5, atol=1e-5)
    assert (got[~mask] == 0).all() and (ent[mask] > 0).all()


def test_logits_scale_with_the_response_not_the_prompt(tiny_model_dir, monkeypatch):
    """The vocabulary projection runs on response positions only: a 6K-token prompt with a
    1K-token response projects 1K rows, as many as a 100-token prompt does."""
    import memrl.rl.trainer.logprobs as forward_module

    model = load_model(tiny_model_dir)
    head_rows = []
    fused = forward_module.linear_logprobs

    def counting(hidden, *args, **kwargs):
        head_rows.append(hidden.shape[0])
        return fused(hidden, *args, **kwargs)

    monkeypatch.setattr(forward_module, "linear_logprobs", counting)
    for prompt_len in (100, 6000):
        s = Conversation([4] * prompt_len, [5] * 1000, [0.0] * 1000, 0, "g", 0, "final")
        with torch.no_grad():
            response_logprobs(model, collate([s], pad_id=0))
    assert head_rows == [1000, 1000]


def test_fused_projection_gives_the_gradients_of_the_plain_one(tiny_model_dir):
    """linear_logprobs (chunked projection + log-prob with its own backward) against the plain
    head(hidden) -> log_softmax path (taken when the entropy needs a gradient)."""
    model = load_model(tiny_model_dir)
    model.train()
    samples = [Conversation(list(range(3, 30)), [7, 8, 9, 2], [0.0] * 4, 0, "g", 0, "final"),
               Conversation([5, 6], [11, 12, 13], [0.0] * 3, 1, "g", 0, "final")]
    t = collate(samples, pad_id=0)
    grads = []
    for plain in (False, True):
        model.zero_grad()
        lp, ent = response_logprobs(model, t, temperature=0.8, with_entropy=True,
                                    entropy_grad=plain)
        (lp * torch.linspace(-1, 1, lp.numel()).reshape(lp.shape)).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        values = (lp.detach(), ent.detach())
        if not plain:
            fused_values = values
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fused_values[0], values[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_values[1], values[1], rtol=1e-5, atol=1e-5)

"""Every config shipped in configs/ validates, and the real-run example mirrors MemAgent."""

import warnings
from pathlib import Path

import pytest

from memrl.config import load_config
from memrl.recipes.config import TrainConfig
from memrl.recipes.evaluate import EvalConfig
from memrl.recipes.sft_config import SFTConfig

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_validates(path):
    """`*_sft.yaml` configs are `memrl sft` configs, `*_suite*.yaml` `memrl eval` configs; the
    others `memrl train` configs. None raises a warning."""
    kind = (SFTConfig if path.stem.endswith("_sft") else
            EvalConfig if "_suite" in path.stem else TrainConfig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(kind, path)


def test_memagent_example_mirrors_published_hyperparameters():
    path = Path(__file__).resolve().parents[1] / "configs" / "memagent_qwen2.5-7b_hotpotqa.yaml"
    cfg = load_config(TrainConfig, path)
    assert cfg.memagent.chunk_size == 5000 and cfg.memagent.max_memory_tokens == 1024
    assert cfg.rollout.n == 16 and cfg.optim.lr == 1e-6 and cfg.optim.warmup_steps == 20
    assert cfg.rl.clip_ratio_high == 0.20 and cfg.rl.kl_loss_type == "low_var_kl"
    assert cfg.rl.kl_loss_coef == 0.001 and cfg.rl.use_kl_loss
    assert cfg.data.train_batch_size == 128 and cfg.rl.ppo_mini_batch_size == 8
    assert not cfg.rl.norm_adv_by_std and cfg.rl.entropy_coeff == 0
    assert not cfg.rl.dynamic_sampling and not cfg.data.shuffle and cfg.rl.overlong == "keep"
    assert cfg.rl.clip_ratio_low == 0.2 and cfg.rl.clip_ratio_c == 3.0
    assert cfg.rl.reward == "memagent_em" and cfg.rollout.temperature == 1.0
    assert cfg.rollout.top_p == 1.0
    assert cfg.memagent.max_chunks == 8 and cfg.memagent.truncation == "center"
    val = cfg.rollout.val
    assert (val.n, val.temperature, val.top_p) == (4, 1.0, 0.7)
    assert cfg.trainer.total_epochs == 30 and cfg.trainer.test_freq == 5


def test_memagent_example_runs_as_published_on_vllm_and_fsdp():
    """Issue 21: the engine, sharding and the keys docs/training_protocol.md section 3 lists."""
    path = Path(__file__).resolve().parents[1] / "configs" / "memagent_qwen2.5-7b_hotpotqa.yaml"
    cfg = load_config(TrainConfig, path)
    assert cfg.model.strategy == "fsdp" and cfg.rollout.engine == "vllm"
    assert cfg.rollout.mode == "lockstep" and cfg.rl.remove_padding
    vllm = cfg.rollout.vllm
    assert (vllm.gpu_memory_utilization, vllm.tensor_model_parallel_size) == (0.6, 1)
    assert (vllm.max_num_batched_tokens, vllm.max_num_seqs, vllm.max_model_len) == (
        16384, 1024, 8192 + 1024)
    assert not vllm.free_cache_engine and not vllm.enforce_eager
    assert cfg.trainer.resume == "auto" and cfg.model.gradient_checkpointing
    assert cfg.memagent.prompts == "memagent-published"
    assert "\\boxed{{}}" in cfg.memagent.resolved_prompts.final_template
    # 128 questions x 16 trajectories a step: no per-trajectory records by default
    assert not cfg.trainer.log_trajectories.active(cfg.data.train_batch_size * cfg.rollout.n)

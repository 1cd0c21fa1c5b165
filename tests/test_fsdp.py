"""FSDP2 (`model.strategy: fsdp`) on CPU with gloo against one replicated process (both
packed, varlen attention: the GPU's defaults): the same
weights after each optimizer step, the same logged metrics with uneven micro-batch counts
per rank, sharded checkpoints resumed on 1 and 2 ranks, and exported as a plain HF model.

The multi-process runs use `tests/dist_train.py` (see tests/test_distributed.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import assert_same_metrics, assert_same_weights, overrides, run_helper

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.recipes.config import TrainConfig
from memrl.recipes.sft_config import SFTConfig
from memrl.run.checkpoint import (
    export_checkpoint,
    load_checkpoint,
    read_checkpoint_marker,
    save_checkpoint,
)
from memrl.run.metrics import read_metrics

PACKED = ["model.attn_implementation=varlen", "rl.remove_padding=true"]
"""The runs take the GPU's default path: packed rows, varlen attention (sample by sample on
the CPU), with rank 1's padding micro-batches packed too."""
FSDP = ["model.strategy=fsdp", "trainer.keep_last=3", *PACKED]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fsdp_data")
    save_records_jsonl(make_synthetic_records(16, num_docs=2, seed=0), d / "train.jsonl")
    save_records_jsonl(make_synthetic_records(3, num_docs=2, seed=1), d / "val.jsonl")
    return d


# The tests of `runs` on one xdist worker (scripts/test.sh: --dist loadgroup): split over two
# workers, each ran the module's runs.
runs_group = pytest.mark.xdist_group("fsdp_runs")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, data_dir, tmp_path_factory) -> dict[str, Path]:
    """One replicated process for 3 steps; FSDP on 2 ranks for step 1, resumed on 1 rank
    for step 2, then on 2 ranks again for step 3 (DCP resharding both ways)."""
    base = tmp_path_factory.mktemp("fsdp_runs")
    single, fsdp = base / "single", base / "fsdp"
    args = lambda out, *extra: overrides(tiny_model_dir, data_dir, out, *extra)  # noqa: E731
    run_helper(1, args(single, "trainer.total_steps=3", "trainer.keep_last=3", *PACKED))
    run_helper(2, args(fsdp, "trainer.total_steps=1", *FSDP))
    first = read_metrics(fsdp / "metrics.jsonl")
    run_helper(1, args(fsdp, "trainer.total_steps=2", "trainer.resume=auto", *FSDP))
    run_helper(2, args(fsdp, "trainer.total_steps=3", "trainer.resume=auto", *FSDP))
    return {"single": single, "fsdp": fsdp, "step1_metrics": first}


def step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:08d}"


def exported_weights(run: Path, step: int, out: Path) -> dict[str, torch.Tensor]:
    export_checkpoint(step_dir(run, step), out)
    return load_file(out / "model.safetensors")


@pytest.mark.pipeline
@runs_group
@pytest.mark.slow
def test_fsdp_on_two_ranks_takes_the_single_process_step(runs, tiny_model_dir, tmp_path):
    # Rank 1 holds one question of three, none of the second mini-batch: it runs padding
    # micro-batches so that both ranks make the same FSDP collectives.
    single = load_file(step_dir(runs["single"], 1) / "model" / "model.safetensors")
    start = load_file(tiny_model_dir / "model.safetensors")
    assert max((single[k] - start[k]).abs().max().item() for k in single) > 5e-6
    assert read_checkpoint_marker(step_dir(runs["fsdp"], 1))["format"] == "sharded"
    assert_same_weights(exported_weights(runs["fsdp"], 1, tmp_path / "hf1"), single)
    (fsdp_metrics,) = runs["step1_metrics"]
    assert_same_metrics(fsdp_metrics, read_metrics(runs["single"] / "metrics.jsonl")[0])
    assert fsdp_metrics["train/groups"] == 3.0 and "val/score" in fsdp_metrics


@pytest.mark.pipeline
@runs_group
@pytest.mark.slow
def test_sharded_checkpoints_resume_on_one_and_on_two_ranks(runs, tmp_path):
    ckpt = step_dir(runs["fsdp"], 3)
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    for step in (2, 3):
        state = json.loads((step_dir(runs["fsdp"], step) / "trainer_state.json").read_text())
        assert state["step"] == step
        single = load_file(step_dir(runs["single"], step) / "model" / "model.safetensors")
        assert_same_weights(exported_weights(runs["fsdp"], step, tmp_path / f"hf{step}"), single)
    got = read_metrics(runs["fsdp"] / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2, 3]
    for a, b in zip(got, read_metrics(runs["single"] / "metrics.jsonl"), strict=True):
        assert_same_metrics(a, b)


@pytest.mark.pipeline
@runs_group
@pytest.mark.slow
def test_export_of_a_sharded_checkpoint_loads_and_evaluates(runs, tmp_path):
    from transformers import AutoModelForCausalLM

    hf = tmp_path / "hf"
    assert cli_main(["export", str(runs["fsdp"]), str(hf)]) == 0
    model = AutoModelForCausalLM.from_pretrained(hf)
    single = load_file(step_dir(runs["single"], 3) / "model" / "model.safetensors")
    assert_same_weights({k: v for k, v in model.state_dict().items() if k in single}, single)
    rh = tmp_path / "rh"
    rh.mkdir()
    (rh / "eval_2.json").write_text(json.dumps([
        {"index": 0, "input": "Where?", "answers": ["Paris"], "num_docs": 2,
         "context": "Document 1:\nA\nParis is here.\n\nDocument 2:\nB\nNothing."}
    ]))
    assert cli_main([
        "eval", f"model.path={hf}", f"eval.benchmarks=[ruler-hqa={rh}]", "eval.num_docs=[2]",
        "memagent.chunk_size=16", "memagent.max_memory_tokens=4", "memagent.max_final_tokens=4",
        f"eval.out_dir={tmp_path / 'eval'}", "eval.progress=false",
    ]) == 0
    assert (tmp_path / "eval" / "ruler-hqa" / "results.json").exists()


# ---- in one process (a process group of one): the checkpoint format and its errors


@pytest.fixture
def group_of_one():
    from memrl.distributed import destroy_process_group, init_process_group

    dist = init_process_group(60, device="cpu", always=True)
    yield dist
    destroy_process_group()


def sharded_policy(path: Path):
    from memrl.inference.loader import load_model
    from memrl.rl.trainer.sharding import shard

    return shard(load_model(path, device="cpu", dtype=torch.float32), "cpu")


def take_a_step(model, optimizer) -> None:
    ids = torch.arange(3, 11).unsqueeze(0)
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_sharded_checkpoint_loads_into_a_replicated_model(tiny_model_dir, tmp_path,
                                                            group_of_one):
    from memrl.inference.loader import load_model
    from memrl.rl.trainer.sharding import is_sharded

    assert group_of_one == Dist()
    model = sharded_policy(tiny_model_dir)
    assert is_sharded(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    take_a_step(model, optimizer)
    path = save_checkpoint(tmp_path / "ckpt", 1, model=model, optimizer=optimizer,
                           scheduler=None, tokenizer=None, trainer_state={"epoch": 0},
                           config_yaml="", keep_last=1, dist=group_of_one)
    assert read_checkpoint_marker(path)["format"] == "sharded"
    assert (path / "sharded" / ".metadata").is_file() and (path / "rng" / "rank_00000.pt").is_file()
    whole = {k: v.full_tensor() for k, v in model.state_dict().items()}

    plain = load_model(tiny_model_dir, device="cpu", dtype=torch.float32)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    assert load_checkpoint(path, model=plain, optimizer=plain_opt)["step"] == 1
    for k, v in plain.state_dict().items():
        assert torch.equal(v, whole[k]), k
    step = next(iter(plain_opt.state.values()))["step"]
    assert float(step) == 1.0  # AdamW's state came back, not a fresh one

    exported = export_checkpoint(path, tmp_path / "hf")
    saved = load_file(exported / "model.safetensors")
    assert all(torch.equal(saved[k], whole[k]) for k in saved)


def test_a_replicated_checkpoint_is_refused_by_a_sharded_model(tiny_model_dir, tmp_path,
                                                               group_of_one):
    from memrl.inference.loader import load_model

    plain = load_model(tiny_model_dir, device="cpu", dtype=torch.float32)
    path = save_checkpoint(tmp_path / "ckpt", 1, model=plain, optimizer=None, scheduler=None,
                           tokenizer=None, trainer_state={}, config_yaml="", keep_last=1)
    with pytest.raises(MemrlInputError, match="model.strategy=replicate"):
        load_checkpoint(path, model=sharded_policy(tiny_model_dir))


def test_the_recipe_set_up_directly_shards_on_one_process(tiny_model_dir, data_dir, tmp_path):
    # grpo.setup without a Dist (a script's call, as the GPU benchmarks make) joins a group
    # of one for FSDP, as `memrl train` does
    from memrl.distributed import destroy_process_group
    from memrl.recipes import grpo
    from memrl.rl.trainer.sharding import is_sharded

    cfg = load_config(TrainConfig, None, [*overrides(tiny_model_dir, data_dir, tmp_path),
                                          "model.strategy=fsdp"])
    try:
        run = grpo.setup(cfg)
        assert is_sharded(run.actor.model)
        run.engine.close()
    finally:
        destroy_process_group()


def test_fsdp_options_are_checked(tiny_model_dir, data_dir, tmp_path):
    base = overrides(tiny_model_dir, data_dir, tmp_path)
    cfg = load_config(TrainConfig, None, [*base, "model.strategy=fsdp",
                                          "model.fsdp.cpu_offload=true"])
    assert cfg.model.fsdp.cpu_offload and cfg.model.fsdp.reshard_after_forward
    with pytest.raises(MemrlInputError, match="strategy fsdp trains every weight"):
        load_config(TrainConfig, None, [*base, "model.strategy=fsdp", "model.lora.enabled=true"])
    with pytest.raises(MemrlInputError, match="model.strategy"):
        load_config(TrainConfig, None, [*base, "model.strategy=zero3"])
    with pytest.raises(MemrlInputError, match="memrl sft trains on one process"):
        load_config(SFTConfig, None, [f"model.path={tiny_model_dir}",
                                      f"data.train_file={data_dir / 'train.jsonl'}",
                                      "model.strategy=fsdp"])


def test_a_sharded_critic_takes_the_replicated_step_and_resumes(tiny_model_dir, tiny_tokenizer,
                                                                data_dir, tmp_path,
                                                                group_of_one):
    """PPO's critic under model.strategy fsdp (a group of one): FSDP units per decoder layer
    and the root, the values and update of the whole critic, and a checkpoint that holds its
    shards (critic/sharded/), read back into a sharded and a replicated critic."""
    from torch.distributed.fsdp import FSDPModule

    from memrl.recipes import models
    from memrl.rl.maths.batch import RolloutBatch
    from memrl.rl.maths.gae import gae_batch
    from memrl.run.checkpoint.critic import load_critic
    from memrl.trajectory import Trajectory, Turn

    def turn(prompt, response):
        return Turn(kind="final", prompt_ids=prompt, response_ids=response,
                    response_logprobs=[-1.0] * len(response), response_text="")

    batch = RolloutBatch.from_trajectories([
        Trajectory(record_id="a", turns=(turn([5, 6, 7], [8, 9, 10]), turn([11], [13, 14])),
                   reward=1.0),
        Trajectory(record_id="b", turns=(turn([5, 6], [20, 21, 22, 23]),), reward=0.0)])
    base = [*overrides(tiny_model_dir, data_dir, tmp_path), "rl.adv_estimator=gae",
            "critic.optim.lr=1e-3", "rl.ppo_mini_batch_size=2", "rollout.n=1"]
    critics, stats = {}, {}
    for strategy in ("replicate", "fsdp"):
        torch.manual_seed(0)
        cfg = load_config(TrainConfig, None, [*base, f"model.strategy={strategy}"])
        critic = models.build_critic(cfg, tiny_tokenizer, group_of_one, total_steps=2)
        values = critic.values(batch)
        stats[strategy] = critic.update(gae_batch(batch.with_values(values), gamma=1.0, lam=0.9))
        critics[strategy] = critic
    sharded = critics["fsdp"]
    units = [m for m in sharded.model.modules() if isinstance(m, FSDPModule)]
    assert len(units) == 1 + len(sharded.model.body.layers)  # every layer, and the root
    assert stats["fsdp"].vf_loss == pytest.approx(stats["replicate"].vf_loss, rel=1e-6)
    assert stats["fsdp"].grad_norm == pytest.approx(stats["replicate"].grad_norm, rel=1e-5)
    whole = {k: v.full_tensor() for k, v in sharded.model.state_dict().items()}
    plain = critics["replicate"].model.state_dict()
    assert max((whole[k] - plain[k]).abs().max().item() for k in plain) < 1e-6

    policy = sharded_policy(tiny_model_dir)
    path = save_checkpoint(tmp_path / "ckpt", 1, model=policy, optimizer=None, scheduler=None,
                           tokenizer=None, trainer_state={"epoch": 0}, config_yaml="",
                           keep_last=1, dist=group_of_one, critic=sharded)
    assert (path / "critic" / "sharded" / ".metadata").is_file()
    assert not (path / "critic" / "model.safetensors").exists()
    for strategy in ("fsdp", "replicate"):
        torch.manual_seed(1)  # another value head, replaced by the checkpoint's
        cfg = load_config(TrainConfig, None, [*base, f"model.strategy={strategy}"])
        fresh = models.build_critic(cfg, tiny_tokenizer, group_of_one, total_steps=2)
        load_critic(path, fresh)
        got = fresh.model.state_dict()
        got = {k: getattr(v, "full_tensor", lambda v=v: v)() for k, v in got.items()}
        assert all(torch.equal(got[k], whole[k]) for k in whole), strategy
        assert float(next(iter(fresh.optimizer.state.values()))["step"]) == 1.0
        assert fresh.scheduler.last_epoch == 1

"""Options that change how fast the update runs, not what it computes (issue 24 items 2
and 4):
each gives the same loss, gradients and step as the plain path on the tiny model, float32,
CPU.

- `model.gradient_checkpointing_every_n_layers`: only every n-th decoder layer recomputes
  its activations. Recomputation is the same computation: equal to the plain step exactly
  (tolerance 0), with fewer bytes saved for the backward than without checkpointing and more
  than with every layer checkpointed.
- `model.compile`: torch.compile (inductor) of every decoder layer. Tolerance 1e-5 on
  gradients and losses (fused kernels reorder float32 sums; measured: 1e-6 on the
  gradients, 2.4e-6 on the logged losses and gradient norm). The
  compiled policy's rollouts on the hf engine are the plain policy's, token for token, and
  compile nothing (generation runs eagerly); the update compiles and runs its graphs.
  flex_attention is a graph break in the compiled layers: packed samples through it keep
  to themselves (the packing probe) and give the plain log-probs (forward only: the CPU
  runs no flex_attention backward).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from test_rl_old_logprobs import make_config, rollout_batch, step

from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.recipes import grpo
from memrl.recipes.config import ModelConfig, TrainConfig
from memrl.recipes.models import load_policy

ROOT = Path(__file__).resolve().parents[1]
COMPILE_ATOL = 1e-5


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("options_data")
    save_records_jsonl(make_synthetic_records(16, num_docs=2, seed=0), d / "train.jsonl")
    return d


# ---- gradient checkpointing of every n-th layer
def saved_bytes(model, batch) -> int:
    """Bytes autograd keeps for the backward of one forward of `batch`'s conversations."""
    from memrl.rl.trainer.actor import response_logprobs

    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    tensors = batch.collate(list(range(len(batch.conversations))), 0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = response_logprobs(model, tensors)
    lp.sum().backward()
    model.zero_grad(set_to_none=True)
    return total


def test_checkpointing_every_n_layers_takes_the_plain_step(tiny_model_dir, data_dir, tmp_path):
    settings = {
        "plain": ["model.gradient_checkpointing=false"],
        "all": ["model.gradient_checkpointing=true"],
        "every2": ["model.gradient_checkpointing=true",
                   "model.gradient_checkpointing_every_n_layers=2"],
    }
    runs = {name: grpo.setup(make_config(tiny_model_dir, data_dir, tmp_path / name,
                                         "rl.use_kl_loss=false", *extra))
            for name, extra in settings.items()}
    layers = runs["every2"].actor.model.model.layers
    assert [layer.gradient_checkpointing for layer in layers] == [True, False]
    batch = rollout_batch(runs["plain"])
    saved = {name: saved_bytes(run.actor.model, batch) for name, run in runs.items()}
    assert saved["all"] < saved["every2"] < saved["plain"], saved
    results = {name: step(run, batch, "auto") for name, run in runs.items()}
    p_stats, p_grads, p_params, _ = results["plain"]
    for name in ("all", "every2"):
        stats, grads, params, _ = results[name]
        assert stats.pg_loss == p_stats.pg_loss and stats.grad_norm == p_stats.grad_norm
        for n in p_grads:
            torch.testing.assert_close(grads[n], p_grads[n], atol=0, rtol=0, msg=n)
        for n in p_params:
            torch.testing.assert_close(params[n], p_params[n], atol=0, rtol=0, msg=n)


def test_every_n_layers_needs_checkpointing(tiny_model_dir):
    with pytest.raises(MemrlInputError, match="set model.gradient_checkpointing=true too"):
        load_config(TrainConfig, None, [f"model.path={tiny_model_dir}",
                                        "data.train_file=x.jsonl",
                                        "model.gradient_checkpointing_every_n_layers=2"])


def test_every_n_layers_names_the_transformers_it_needs(tiny_model_dir, monkeypatch):
    """An older transformers (no `every_n_layers`) is refused in one line, not ignored."""
    from transformers import PreTrainedModel

    def old_enable(self, gradient_checkpointing_kwargs=None):
        raise AssertionError("must not be called")

    monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable", old_enable)
    mcfg = ModelConfig(path=str(tiny_model_dir), gradient_checkpointing=True,
                       gradient_checkpointing_every_n_layers=2)
    with pytest.raises(MemrlInputError, match=r"upgrade to transformers>=5\.17"):
        load_policy(mcfg)


# ---- torch.compile of the decoder layers
def test_compile_auto_is_on_for_cuda_only(monkeypatch):
    import torch
    import torch._dynamo

    assert ModelConfig(path="m").compile == "auto"  # the default
    assert ModelConfig(path="m", device="cpu").compiles() is False
    assert ModelConfig(path="m", device="cpu", compile=True).compiles() is True
    assert ModelConfig(path="m", compile=False).compiles() is False
    # a CUDA device (faked: this machine may have none) compiles, unless torch can't
    monkeypatch.setattr("memrl.inference.loader.resolve_device",
                        lambda device=None: torch.device("cuda"))
    with torch._dynamo.config.patch(disable=False):  # the suite may run with it disabled
        assert ModelConfig(path="m").compiles() is True
        assert ModelConfig(path="m", compile=False).compiles() is False
        assert ModelConfig(path="m", lora={"enabled": True}).compiles() is False  # unmeasured
        assert ModelConfig(path="m", lora={"enabled": True}, compile=True).compiles() is True
        monkeypatch.delattr(torch.compiler, "set_stance")
        assert ModelConfig(path="m").compiles() is False
    with torch._dynamo.config.patch(disable=True):  # TORCH_COMPILE_DISABLE=1
        assert ModelConfig(path="m").compiles() is False
    with pytest.raises(ValueError, match="compile"):
        ModelConfig(path="m", compile="sometimes")


def test_compile_is_logged_when_torch_compile_is_disabled(tiny_model_dir, caplog):
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True), \
            caplog.at_level(logging.WARNING, logger="memrl.recipes.models"):
        load_policy(ModelConfig(path=str(tiny_model_dir), compile=True))
    assert "torch.compile is disabled" in caplog.text


def test_compile_names_the_torch_it_needs(tiny_model_dir, monkeypatch):
    monkeypatch.delattr(torch.compiler, "set_stance")
    with pytest.raises(MemrlInputError, match=r"model\.compile.*needs torch>=2\.6"):
        load_policy(ModelConfig(path=str(tiny_model_dir), compile=True))


@pytest.mark.pipeline
@pytest.mark.slow
def test_compiled_layers_take_the_plain_step(tiny_model_dir, data_dir, tmp_path):
    """Several micro-batch shapes, a checkpointed layer (layer 0 of 2) beside a plain one,
    the no-grad old log-prob pass and sampled rollouts, compiled against plain (a
    dynamic-shape graph from the start: with automatic dynamic shapes, a recomputation picked
    the dynamic graph where the forward had run the static one, and the backward failed;
    packed micro-batches run the same compiled layers, checked by hand with the benchmark's
    --remove-padding)."""
    extra = ["model.gradient_checkpointing=true",
             "model.gradient_checkpointing_every_n_layers=2"]
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_DISABLE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "compile_step.py"), str(tiny_model_dir),
         str(data_dir), str(tmp_path), *extra],
        env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recompile_limit" not in done.stderr  # never fell back to running eagerly
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["micro_batches"] >= 2 and len(out["micro_batch_lengths"]) >= 2, out
    assert {"actor/pg_loss", "actor/kl_loss", "actor/entropy",
            "actor/grad_norm"} <= set(out["metric_keys"])
    assert out["grad_keys_equal"]
    assert out["param_moved"] > 1e-4, out  # the step changed the weights
    # Not the parameters after the step: AdamW's first step divides each gradient entry by
    # its own magnitude, so entries near zero turn float noise into differences of up to lr.
    for key in ("metric_diff", "grad_diff"):
        assert out[key] < COMPILE_ATOL, out
    assert out["same_rollouts"], out
    assert out["same_state_dict_names"]
    graphs = out["compiled_graphs"]  # compiled code ran in the update, never in generation
    assert graphs["update_compiled"] > 0 and graphs["update_plain"] == 0, graphs
    assert graphs["rollout_compiled"] == graphs["rollout_plain"] == 0, graphs


# ---- torch.compile with flex_attention and packed micro-batches
def test_flex_attention_is_a_graph_break_with_the_plain_shapes(monkeypatch):
    """`compile_layers` wraps flex_attention (transformers' attention registry) in
    torch.compiler.disable, and the wrapper runs it with dynamo's shape settings of the plain
    path: inside a layer compiled with dynamic=True, transformers' own
    torch.compile(flex_attention) would otherwise compile it with every size dynamic."""
    from torch._dynamo.eval_frame import set_enable_dynamic
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from memrl.recipes.models import attention_outside_graphs

    seen = []

    def flex(*args, **kwargs):
        seen.append(torch._dynamo.config.assume_static_by_default)
        return args, kwargs

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "flex_attention", flex)
    for impl in ("sdpa", "flex_attention", "flex_attention"):  # twice: wrapped once
        attention_outside_graphs(SimpleNamespace(config=SimpleNamespace(
            _attn_implementation=impl)))
    wrapped = ALL_ATTENTION_FUNCTIONS["flex_attention"]
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa
    assert wrapped is not flex and inspect.unwrap(wrapped) is flex
    with set_enable_dynamic(True):  # as while a layer compiled with dynamic=True runs
        assert wrapped(1, x=2) == ((1,), {"x": 2})
    assert seen == [True]


@pytest.mark.pipeline
@pytest.mark.slow
def test_compiled_layers_keep_packed_flex_attention_samples_apart(tiny_model_dir):
    """Packed samples (rl.remove_padding) through flex_attention with model.compile: the
    packing probe passes and the log-probs, entropies and loss equal the plain model's and
    the padded sdpa model's (each sample alone). flex_attention is a graph break in the
    compiled layers: traced into them (dynamic=True), it failed the probe on an H100 (relative
    logit error 0.22) and would not lower under FSDP. The CPU runs no flex_attention
    backward: forward passes only here (train mode with its backward on CUDA)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_DISABLE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "compile_flex.py"), str(tiny_model_dir),
         "flex_attention:packed"],
        env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["traced_flex_attention"] == [], out  # never inside the layers' graphs
    case = out["flex_attention:packed"]
    assert case["probe"] == "ok", case
    for key in ("compiled_vs_plain", "compiled_vs_separate", "plain_vs_separate"):
        assert case[key] and max(case[key].values()) < COMPILE_ATOL, case

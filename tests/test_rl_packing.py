"""Padding-free micro-batches (rl.remove_padding): the packed layout by hand, and log-probs,
entropies, gradients and a whole PPO update equal to the padded path on the tiny Qwen2."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from memrl.errors import MemrlInputError
from memrl.inference.loader import load_model
from memrl.models.attention import VARLEN_NAME, register
from memrl.rl.config import RLConfig
from memrl.rl.maths.batch import Conversation, RolloutBatch, collate
from memrl.rl.trainer.actor import (
    Actor,
    Reference,
    build_optimizer,
    response_logprobs,
    warmup_schedule,
)
from memrl.rl.trainer.packing import check_packed_attention, packed_inputs, varlen_kwargs
from memrl.trajectory import Trajectory, Turn


def sample(prompt, response, traj=0):
    return Conversation(prompt, response, [0.0] * len(response), traj, f"g{traj}", 0, "final")


def test_packed_inputs_by_hand():
    t = collate([sample([5, 6, 7], [8]), sample([9], [10, 11]), sample([12, 13], [14])], 0)
    inputs, mask = packed_inputs(t)
    assert inputs["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]
    assert inputs["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2]]
    # Logit positions of the responses: the last prompt token and the response but its last.
    assert mask.int().tolist() == [[0, 0, 1, 0, 1, 1, 0, 0, 1, 0]]
    assert set(inputs) == {"input_ids", "position_ids"}  # no attention mask
    kw = varlen_kwargs(t)  # the samples' bounds in that row (for model.attn_implementation varlen)
    assert kw["cu_seq_lens_q"].tolist() == [0, 4, 7, 10]
    assert kw["cu_seq_lens_q"].dtype == torch.int32
    assert kw["cu_seq_lens_k"] is kw["cu_seq_lens_q"]
    assert kw["max_length_q"] == kw["max_length_k"] == 4


UNEVEN = [sample(list(range(3, 40)), [7, 8, 9, 2]), sample([5, 6], [11, 12, 13]),
          sample(list(range(50, 61)), [21]), sample([4] * 20, list(range(30, 45)))]


@pytest.mark.parametrize("attn", ["sdpa", "eager", "varlen"])
@pytest.mark.parametrize("entropy_grad", [False, True], ids=["fused", "plain"])
def test_packed_logprobs_and_gradients_equal_the_padded_ones(tiny_model_dir, attn, entropy_grad):
    """varlen: the padded rows run as sdpa, the packed row sample by sample (the CPU's
    stand-in for the flash kernel) from the bounds the caller gives, with no masks built."""
    model = load_model(tiny_model_dir,
                       attn_implementation=register() if attn == "varlen" else attn)
    model.train()
    t = collate(UNEVEN, pad_id=0)
    weights = torch.linspace(-1, 1, t["response_mask"].numel()).reshape(t["response_mask"].shape)
    results = []
    for packed in (False, True):
        model.zero_grad()
        lp, ent = response_logprobs(model, t, temperature=0.8, with_entropy=True,
                                    entropy_grad=entropy_grad, remove_padding=packed)
        loss = (lp * weights).sum() + (0.1 * ent.sum() if entropy_grad else 0.0)
        loss.backward()
        results.append((lp.detach(), ent.detach(), loss.detach(),
                        [p.grad.clone() for p in model.parameters()]))
    (lp0, ent0, loss0, g0), (lp1, ent1, loss1, g1) = results
    mask = t["response_mask"]
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-5)
    assert (lp1[~mask] == 0).all() and (lp1[mask] < 0).all()
    # Gradients: equal to fp32 rounding of the summation order (~1e-6 of each tensor's scale).
    for a, b in zip(g1, g0, strict=True):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()


def turn(prompt, response):
    return Turn(kind="final", prompt_ids=prompt, response_ids=response,
                response_logprobs=[-1.0] * len(response), response_text="x",
                finish_reason="stop")


def rollout_batch() -> RolloutBatch:
    trajs = [Trajectory(record_id=f"q{i // 2}", sample_index=i % 2, reward=float(i % 2),
                        turns=[turn(list(range(3, 3 + p)), list(range(40, 40 + r)))
                               for p, r in shape])
             for i, shape in enumerate([[(30, 5), (4, 9)], [(12, 3)], [(25, 2), (6, 6)],
                                        [(2, 12)]])]
    return RolloutBatch.from_trajectories(trajs)


def make_actor(model_dir, **rl) -> Actor:
    model = load_model(model_dir)
    config = RLConfig(max_tokens_per_micro_batch=48, ppo_mini_batch_size=2, **rl)
    opt = build_optimizer(model, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    return Actor(model, config, optimizer=opt, scheduler=warmup_schedule(opt, 0),
                 grad_clip=1.0, pad_id=0, peak_flops=1e9)


def test_actor_update_with_remove_padding_equals_the_padded_update(tiny_model_dir):
    batch = rollout_batch()
    sizes = [s.num_tokens for s in batch.conversations]
    runs = {}
    for packed in (False, True):
        actor = make_actor(tiny_model_dir, remove_padding=packed)
        ref = Reference(load_model(tiny_model_dir), actor.config, pad_id=0)
        old = actor.logprobs(batch)
        b = batch.with_logprobs(old, ref.logprobs(batch)).with_advantages(
            torch.tensor([0.5, -0.5, 1.0, -1.0]))
        micro = actor.micro_batches(b, list(range(len(b.conversations))))
        runs[packed] = (old, micro, actor.update(b))
    (old0, micro0, m0), (old1, micro1, m1) = runs[False], runs[True]
    for a, b in zip(old1, old0, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # The budget counts real tokens when packed, rows x longest row when padded.
    assert all(sum(sizes[i] for i in m) <= 48 or len(m) == 1 for m in micro1)
    assert all(len(m) * max(sizes[i] for i in m) <= 48 or len(m) == 1 for m in micro0)
    assert len(micro1) < len(micro0)
    for key in ("pg_loss", "kl_loss", "grad_norm", "ppo_kl"):
        assert getattr(m1, key) == pytest.approx(getattr(m0, key), rel=1e-4, abs=1e-6), key
    assert m1.padding_waste == 0.0 and m0.padding_waste > 0.0
    assert m1.tokens_per_micro_batch > m0.tokens_per_micro_batch * (1 - 1e-9)
    assert m1.mfu == pytest.approx(m1.update_tflops_per_s * 1e12 / 1e9)


def test_padding_waste_and_micro_batch_tokens_by_hand(tiny_model_dir):
    """Samples of 3 and 5 tokens in one padded micro-batch: 2 x 5 computed, 2 padded."""
    trajs = [Trajectory(record_id="q", sample_index=i, reward=float(i),
                        turns=[turn([3] * p, [4] * r)])
             for i, (p, r) in enumerate([(2, 1), (3, 2)])]
    batch = RolloutBatch.from_trajectories(trajs)
    b = batch.with_logprobs([torch.zeros(1), torch.zeros(2)]).with_advantages(
        torch.tensor([-1.0, 1.0]))
    for packed, waste, tokens in ((False, 2 / 10, 10.0), (True, 0.0, 8.0)):
        m = make_actor(tiny_model_dir, remove_padding=packed, use_kl_loss=False).update(b)
        assert m.padding_waste == pytest.approx(waste)
        assert m.tokens_per_micro_batch == tokens


class IgnoresPackedPositions(torch.nn.Module):
    """A causal LM that drops position_ids: packed samples would attend to each other."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, position_ids=None, use_cache=False):
        return self.inner(input_ids=input_ids, use_cache=use_cache)


def test_a_model_that_ignores_packing_is_refused_in_one_line(tiny_model_dir):
    model = load_model(tiny_model_dir)
    check_packed_attention(model)  # the tiny Qwen2 keeps packed samples apart
    with pytest.raises(MemrlInputError, match="rl.remove_padding: .*attend to each other"):
        check_packed_attention(IgnoresPackedPositions(model))


def test_varlen_attention_takes_the_packed_bounds_and_builds_no_mask(tiny_model_dir, monkeypatch):
    """A packed forward of model.attn_implementation varlen reaches every layer's attention
    with the samples' bounds and no mask, and transformers never looks for packed samples
    in the position_ids (on a GPU that waits for it); unpacked calls are sdpa's: the same
    logits as an sdpa model, padding mask included."""
    import transformers.masking_utils as masking
    from memrl.models import attention

    model = load_model(tiny_model_dir, attn_implementation=register())
    assert model.config._attn_implementation == VARLEN_NAME
    assert set(attention.packed_masks(model)) == {"full_attention"}  # Qwen2 takes a mapping
    check_packed_attention(model)
    calls = []
    real = attention._per_sample
    monkeypatch.setattr(attention, "_per_sample",
                        lambda q, k, v, cu_q, cu_k, *rest: calls.append(cu_q.tolist())
                        or real(q, k, v, cu_q, cu_k, *rest))
    monkeypatch.setattr(masking, "find_packed_sequence_indices",
                        lambda *a: pytest.fail("looked for packed samples"))
    t = collate(UNEVEN, pad_id=0)
    response_logprobs(model, t, remove_padding=True)
    layers = model.config.num_hidden_layers
    assert calls == [[0, 41, 46, 58, 93]] * layers
    monkeypatch.undo()
    sdpa = load_model(tiny_model_dir, attn_implementation="sdpa")
    with torch.no_grad():
        for m in (model, sdpa):
            m.eval()
        keys = ("input_ids", "attention_mask", "position_ids")
        got, want = (m(**{k: t[k] for k in keys}).logits for m in (model, sdpa))
    mask = t["attention_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-6)


def _block_diagonal_sdpa(q, k, v, bounds, scale, window=None):
    """Reference: sdpa over the whole row with a causal block-diagonal mask (keys within
    the last `window` positions if given)."""
    n = q.shape[2]
    doc = torch.zeros(n, dtype=torch.long)
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        doc[a:b] = i
    mask = (doc[:, None] == doc[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    if window is not None:
        mask &= torch.ones(n, n, dtype=torch.bool).triu(-(window - 1))
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize("window", [None, 2], ids=["causal", "sliding"])
@pytest.mark.parametrize("api", ["cpu", "torch-2.9", "torch-2.11", "torch-2.13"])
def test_varlen_attention_with_grouped_heads_and_each_torch_api(monkeypatch, api, window):
    """4 query heads over 2 key/value heads, scale 0.3, three samples, causal or a sliding
    window of 2: the CPU path, and the flash path's arguments for each keyword set torch's
    varlen_attn has had (is_causal or window_size; enable_gqa or not; scale or not), run by
    a stand-in kernel. torch 2.9's has no window: a one-line error."""
    from memrl.models import attention

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 9, 8, generator=gen)
    k, v = (torch.randn(1, 2, 9, 8, generator=gen) for _ in range(2))
    bounds = [0, 4, 6, 9]
    want = _block_diagonal_sdpa(q, k, v, bounds, 0.3, window)
    cu = torch.tensor(bounds, dtype=torch.int32)
    if api == "cpu":
        got, _ = attention.varlen_attention(None, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu,
                                            max_length_q=4, sliding_window=window)
    else:
        def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal=None, window_size=None,
                   enable_gqa=False, scale=None):
            assert is_causal is True or window_size[1] == 0
            left = None if is_causal or window_size[0] == -1 else window_size[0] + 1
            assert enable_gqa or k.shape[1] == q.shape[1]
            assert (max_q, max_k) == (4, 4) and cu_q.dtype == torch.int32
            return attention._per_sample(q, k, v, cu_q, cu_k,
                                         scale if scale is not None else 8 ** -0.5, left)

        names = {"torch-2.9": {"is_causal"}, "torch-2.11": {"window_size", "scale"},
                 "torch-2.13": {"window_size", "scale", "enable_gqa"}}[api]
        monkeypatch.setattr(attention, "_API", (kernel, frozenset(names)))
        qs, ks, vs = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
        if api == "torch-2.9" and window is not None:
            with pytest.raises(ValueError, match="sliding-window .* window_size"):
                attention._flash(qs, ks, vs, cu, cu, 4, 4, 0.3, window)
            return
        got = attention._flash(qs, ks, vs, cu, cu, 4, 4, 0.3, window).unsqueeze(0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_remove_padding_auto_packs_exactly_the_varlen_models(tiny_model_dir):
    """rl.remove_padding auto (the default): packed for a model that attends with varlen,
    padded for sdpa and for a varlen model whose attention the kernel cannot run (logit
    soft-capping); model.attn_implementation auto is transformers' default on a CPU."""
    from memrl.recipes.config import ModelConfig
    from memrl.recipes.models import attention

    assert RLConfig().remove_padding == "auto"
    varlen = make_actor(tiny_model_dir)
    varlen.model = load_model(tiny_model_dir, attn_implementation=register())
    assert varlen.packed
    assert not make_actor(tiny_model_dir).packed  # sdpa
    varlen.model.config.attn_logit_softcapping = 30.0
    assert not varlen.packed
    assert make_actor(tiny_model_dir, remove_padding=True).packed
    assert ModelConfig(path="m").attn_implementation == "auto"
    assert attention(ModelConfig(path="m", device="cpu")) == {}
    assert attention(ModelConfig(path="m", device="cpu", attn_implementation="varlen")) == {
        "attn_implementation": VARLEN_NAME}


def test_attention_auto_on_a_gpu_is_varlen_in_16_bit_only(monkeypatch):
    """On a CUDA device auto is varlen for mixed precision (dtype auto) and 16-bit weights,
    and transformers' default for float32 (the kernel takes 16-bit inputs only)."""
    from memrl.recipes import models
    from memrl.recipes.config import ModelConfig

    monkeypatch.setattr(models, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(models, "varlen_available", lambda: True)
    for dtype, want in (("auto", {"attn_implementation": VARLEN_NAME}),
                        ("bfloat16", {"attn_implementation": VARLEN_NAME}), ("float32", {})):
        assert models.attention(ModelConfig(path="m", dtype=dtype)) == want, dtype


def test_a_lora_varlen_model_packs_and_equals_its_padded_path(tiny_model_dir):
    """LoRA (peft) over a varlen model: rl.remove_padding auto packs it, and its packed
    log-probs and adapter gradients equal the padded ones."""
    peft = pytest.importorskip("peft")
    base = load_model(tiny_model_dir, attn_implementation=register())
    torch.manual_seed(0)  # the adapters' initialisation
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8,
                                                      target_modules="all-linear"))
    for name, p in model.named_parameters():  # adapters away from zero: nonzero grads
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(1))
    from memrl.models.attention import uses_varlen

    assert uses_varlen(model)
    t = collate(UNEVEN, pad_id=0)
    results = []
    for packed in (False, True):
        model.zero_grad()
        lp, _ = response_logprobs(model, t, remove_padding=packed)
        lp.sum().backward()
        results.append((lp.detach(), [p.grad.clone() for p in model.parameters()
                                      if p.requires_grad]))
    (lp0, g0), (lp1, g1) = results
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)  # fp32 rounding
    for a, b in zip(g1, g0, strict=True):  # fp32 rounding of other summation orders
        assert (a - b).abs().max() <= 5e-5 * b.abs().max().clamp(min=1e-12)


@pytest.mark.parametrize("arch", ["llama", "mistral-sliding"])
def test_varlen_on_decoders_that_build_their_own_masks(arch, monkeypatch):
    """Llama and Mistral take no mapping of masks (Qwen2 does): packed varlen still gets the
    bounds in every layer, builds no mask, and equals the padded path; Mistral with a
    sliding window of 4 tokens (shorter than the samples) runs the window per sample."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig

    from memrl.models import attention

    shape = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    config = (LlamaConfig(**shape) if arch == "llama"
              else MistralConfig(**shape, sliding_window=4))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=register()).eval()
    assert attention.packed_masks(model) is None
    t = collate(UNEVEN, pad_id=0)
    padded, _ = response_logprobs(model, t, remove_padding=False)
    calls = []
    real = attention._per_sample
    monkeypatch.setattr(attention, "_per_sample",
                        lambda q, k, v, cu_q, cu_k, *rest: calls.append(rest)
                        or real(q, k, v, cu_q, cu_k, *rest))
    monkeypatch.setattr(attention, "_SDPA_MASK", lambda *a, **k: pytest.fail("built a mask"))
    packed, _ = response_logprobs(model, t, remove_padding=True)
    window = None if arch == "llama" else 4
    assert len(calls) == 2 and all(rest[-1] == window for rest in calls)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_varlen_under_gradient_checkpointing_takes_the_same_gradients(tiny_model_dir):
    """Checkpointed layers recompute the packed varlen attention in the backward with the
    same bounds: log-probs and gradients equal those without checkpointing."""
    from memrl.recipes.models import checkpoint_layers

    t = collate(UNEVEN, pad_id=0)
    results = []
    for checkpointed in (False, True):
        model = load_model(tiny_model_dir, attn_implementation=register())
        model.train()
        if checkpointed:
            checkpoint_layers(model, every_n_layers=1, fsdp=False)
        lp, _ = response_logprobs(model, t, remove_padding=True)
        lp.sum().backward()
        results.append((lp.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp0, g0), (lp1, g1) = results
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-6)
    for a, b in zip(g1, g0, strict=True):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max().clamp(min=1e-12)


def test_a_varlen_model_generates_as_sdpa(tiny_model_dir):
    """Generation (the hf rollout engine's path: left padding, a KV cache) of a model
    loaded with varlen gives the sdpa model's tokens."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 10, 11, 12, 13]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    outs = []
    for impl in (register(), "sdpa"):
        model = load_model(tiny_model_dir, attn_implementation=impl).eval()
        outs.append(model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6,
                                   do_sample=False, pad_token_id=0))
    assert torch.equal(outs[0], outs[1])


def test_varlen_attention_refuses_what_it_cannot_run():
    from memrl.models.attention import varlen_attention

    q = torch.zeros(1, 2, 4, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="one packed row"):
        varlen_attention(None, q.expand(2, -1, -1, -1), q, q, None, cu_seq_lens_q=cu)
    with pytest.raises(ValueError, match="dropout"):
        varlen_attention(None, q, q, q, None, dropout=0.1, cu_seq_lens_q=cu)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 3), st.data())
def test_gather_rows_is_boolean_indexing_forward_and_backward(rows, length, width, data):
    # on the CPU both (the point of gather_rows, a CPU mask for GPU data, needs a GPU)
    from memrl.rl.trainer.logprobs import gather_rows

    bits = data.draw(st.lists(st.booleans(), min_size=rows * length, max_size=rows * length))
    select = torch.tensor(bits).reshape(rows, length)
    x = torch.randn(rows, length, width, dtype=torch.float64, requires_grad=True)
    got = gather_rows(x, select)
    want = x[select]
    assert torch.equal(got, want)
    weights = torch.randn_like(want)
    (grad_got,) = torch.autograd.grad((got * weights).sum(), x)
    (grad_want,) = torch.autograd.grad((want * weights).sum(), x)
    assert torch.equal(grad_got, grad_want)
    assert torch.equal(gather_rows(x.detach()[..., 0], select), x.detach()[..., 0][select])

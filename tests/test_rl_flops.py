"""Training FLOPs, MFU and padding waste (memrl.rl.maths.flops) against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from memrl.inference.loader import load_model
from memrl.rl.maths.flops import (
    ModelShape,
    device_peak_flops,
    forward_flops,
    mfu,
    padding_waste,
    train_flops,
)

SHAPE = ModelShape(body_params=100, head_params=50, layers=2, attn_dim=8)


def test_flops_by_hand():
    # Two sequences of 3 and 5 tokens, 4 logit positions:
    # 2·100·8 + 2·50·4 + 4·2·8·(3² + 5²) = 1600 + 400 + 2176
    assert forward_flops([3, 5], SHAPE, logit_tokens=4) == 4176
    assert train_flops([3, 5], SHAPE, logit_tokens=4) == 3 * 4176
    # Packed or not, the attention term is per sequence: one sequence of 8 costs more.
    assert forward_flops([8], SHAPE, logit_tokens=4) == 1600 + 400 + 4 * 2 * 8 * 64
    assert forward_flops([], SHAPE, logit_tokens=0) == 0
    with pytest.raises(ValueError):
        forward_flops([-1], SHAPE, logit_tokens=0)


def test_mfu_and_padding_waste_by_hand():
    assert mfu(12528, 2.0, 1000.0) == pytest.approx(6.264)
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1.0)
    # Rows of 3 and 5 tokens padded to 5: 10 computed, 2 of them padding.
    assert padding_waste(8, 10) == pytest.approx(0.2)
    assert padding_waste(8, 8) == 0.0 and padding_waste(0, 0) == 0.0
    with pytest.raises(ValueError):
        padding_waste(11, 10)


def test_the_shape_of_the_tiny_qwen2_by_hand(tiny_model_dir):
    """hidden 128, 2 layers, 4 heads of 32, 2 KV heads, MLP 256, tied embeddings. Per layer:
    q 128·128+128, k and v 128·64+64 each, o 128·128, MLP 3·128·256, two norms of 128."""
    model = load_model(tiny_model_dir)
    layer = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 256 + 2 * 128
    vocab = model.config.vocab_size
    assert ModelShape.of(model) == ModelShape(
        body_params=2 * layer + 128, head_params=vocab * 128, layers=2, attn_dim=128
    )
    assert ModelShape.of(torch.nn.Linear(2, 2)) is None


def test_qwen25_05b_has_its_published_non_embedding_size():
    """Qwen2.5-0.5B: 0.49B parameters, 0.36B of them non-embedding (its model card)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True)
    with torch.device("meta"):
        shape = ModelShape.of(Qwen2ForCausalLM(config))
    assert round(shape.body_params / 1e9, 2) == 0.36
    assert round((shape.body_params + shape.head_params) / 1e9, 2) == 0.49
    assert (shape.layers, shape.attn_dim) == (24, 896)


def test_peak_flops_of_known_gpus(monkeypatch):
    names = iter(["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "Tesla T4"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: next(names))
    assert device_peak_flops("cuda:0", torch.bfloat16) == 989e12
    assert device_peak_flops("cuda:0", torch.float16) == 756e12
    assert device_peak_flops("cuda:0", torch.bfloat16) is None  # not in the table
    assert device_peak_flops("cuda:0", torch.float32) is None
    assert device_peak_flops("cpu", torch.bfloat16) is None

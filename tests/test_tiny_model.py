"""The tiny random Qwen2 model: loadable by the Auto classes, deterministic, lossless tokenizer."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.cli import main
from memrl.errors import MemrlInputError
from memrl.models import build_tiny_model, build_tiny_tokenizer, count_parameters


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def fresh_tokenizer():
    """The tokenizer as trained in memory, before saving / reloading."""
    return build_tiny_tokenizer()


def test_loads_with_auto_classes(tiny_model, tiny_tokenizer, tiny_model_dir) -> None:
    n_params = sum(p.numel() for p in tiny_model.parameters())
    assert 300_000 <= n_params <= 2_000_000
    assert count_parameters(tiny_model_dir) == n_params
    assert tiny_model.config.model_type == "qwen2"
    assert tiny_model.config.vocab_size == len(tiny_tokenizer)
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_model.config.eos_token_id == tiny_tokenizer.eos_token_id
    ids = torch.tensor([tiny_tokenizer.encode("Where is Paris?", add_special_tokens=False)])
    logits = tiny_model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tiny_tokenizer))
    assert torch.isfinite(logits).all()


def test_chat_template_renders_chatml(tiny_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who?"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWho?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    im_start = tiny_tokenizer.convert_tokens_to_ids("<|im_start|>")
    # the ChatML markers are single special tokens, not spelled out in bytes
    assert ids.count(im_start) == 3
    assert ids.count(tiny_tokenizer.eos_token_id) == 2


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_round_trip_is_lossless(tiny_tokenizer, fresh_tokenizer, text: str) -> None:
    # Qwen tokenizers apply NFC, so text round-trips exactly up to NFC normalisation.
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
    # the saved tokenizer (reloaded as transformers' Qwen2Tokenizer) splits like the trained one
    assert fresh_tokenizer.encode(text, add_special_tokens=False) == ids


def test_round_trip_examples(tiny_tokenizer) -> None:
    for text in ["日本語 🤖 naïve", "  two  spaces\n\ttab", "<|im_end|> literal", "x" * 300]:
        ids = tiny_tokenizer.encode(text, add_special_tokens=False)
        assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.decode(tiny_tokenizer.encode("e\u0301")) == "\u00e9"  # NFC


def _state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_deterministic_by_seed(tmp_path) -> None:
    rng_before = torch.get_rng_state()
    a = build_tiny_model(tmp_path / "a", seed=7)
    b = build_tiny_model(tmp_path / "b", seed=7)
    c = build_tiny_model(tmp_path / "c", seed=8)
    assert torch.equal(torch.get_rng_state(), rng_before), "global RNG must be left alone"

    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    sa, sc = _state(a), _state(c)
    assert sa.keys() == sc.keys()
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    # the tokenizer depends on the corpus, not on the seed
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_custom_shape_and_corpus(tmp_path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    out = build_tiny_model(
        tmp_path / "m",
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        vocab_size=400,
        corpus=["zyzzyva zyzzyva zyzzyva"],
    )
    config = AutoConfig.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (32, 1, 1)
    assert config.vocab_size == len(tokenizer) <= 400
    assert count_parameters(out) < 300_000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hidden_size": 66, "num_heads": 4}, "even head dimension"),
        ({"hidden_size": 64, "num_heads": 3}, "even head dimension"),
        ({"num_heads": 4, "num_kv_heads": 3}, "multiple of num_kv_heads"),
        ({"num_layers": 0}, "num_layers must be >= 1"),
    ],
)
def test_bad_shape_is_a_user_error(tmp_path, kwargs, match) -> None:
    with pytest.raises(MemrlInputError, match=match):
        build_tiny_model(tmp_path / "bad", **kwargs)
    assert not (tmp_path / "bad").exists()


def test_cli_init_tiny_model(tmp_path, capsys) -> None:
    from transformers import AutoConfig

    out = tmp_path / "cli_model"
    code = main(["init-tiny-model", str(out), "seed=1", "hidden_size=64", "num_layers=1",
                 "vocab_size=600"])
    assert code == 0
    printed = capsys.readouterr().out
    n = count_parameters(out)
    assert f"{n:,} parameters" in printed and str(out) in printed
    config = AutoConfig.from_pretrained(out)
    assert (config.hidden_size, config.num_hidden_layers) == (64, 1)
    assert config.vocab_size <= 600


def test_cli_init_tiny_model_bad_arguments(tmp_path, capsys) -> None:
    assert main(["init-tiny-model", str(tmp_path / "m"), "hidden_size=66"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert main(["init-tiny-model", str(tmp_path / "m"), "hidden_siz=64"]) == 2
    assert "hidden_siz: unknown key" in capsys.readouterr().err
    assert main(["init-tiny-model", str(tmp_path / "m"), "num_layers=two"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["init-tiny-model", str(a_file)]) == 2
    assert "not a directory" in capsys.readouterr().err

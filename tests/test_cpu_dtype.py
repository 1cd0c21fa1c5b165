"""The dtype a model runs in on a CPU when none is asked for: bfloat16 only where the CPU has
bfloat16 matrix instructions (x86 AMX-BF16, AVX512-BF16), float32 elsewhere; a dtype the
user names always wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.cli import main
from memrl.inference import loader
from memrl.inference.base import SamplingParams
from memrl.inference.hf import HFEngine, decode_matmuls
from memrl.inference.loader import cpu_compute_dtype, cpu_flags, load_pretrained, resolve_dtype

# /proc/cpuinfo lines of real machines (abridged).
AVX2_ONLY = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi1 bmi2"
ZEN4 = AVX2_ONLY + " avx512f avx512bw avx512vl avx512_bf16 avx512_vnni"
SAPPHIRE_RAPIDS = AVX2_ONLY + " avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
GRAVITON3 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve bf16 i8mm svebf16"


def cpuinfo(tmp_path, key: str, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: Some CPU\n{key}\t\t: {flags}\n\n"
                    f"processor\t: 1\n{key}\t\t: {flags}\n")
    return path


@pytest.mark.parametrize(("key", "flags", "expected"), [
    ("flags", AVX2_ONLY, torch.float32),
    ("flags", ZEN4, torch.bfloat16),
    ("flags", SAPPHIRE_RAPIDS, torch.bfloat16),
    ("Features", GRAVITON3, torch.float32),
    ("Features", "fp asimd evtstrm aes crc32", torch.float32),
])
def test_bfloat16_only_with_x86_bfloat16_instructions(tmp_path, key, flags, expected):
    found = cpu_flags(cpuinfo(tmp_path, key, flags))
    assert found == frozenset(flags.split())
    assert cpu_compute_dtype(found) == expected


def test_no_cpuinfo_is_float32(tmp_path):
    assert cpu_flags(tmp_path / "absent") == frozenset()
    assert cpu_compute_dtype(frozenset()) == torch.float32


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_cpuinfo_text_gives_a_set_of_flags(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cpuinfo") / "cpuinfo"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    flags = cpu_flags(path)
    assert isinstance(flags, frozenset) and all(isinstance(f, str) and f for f in flags)
    assert cpu_compute_dtype(flags) in (torch.float32, torch.bfloat16)


@pytest.mark.parametrize(("flags", "auto"), [(AVX2_ONLY, torch.float32),
                                             (ZEN4, torch.bfloat16),
                                             (SAPPHIRE_RAPIDS, torch.bfloat16)])
def test_fast_follows_the_cpu_auto_stays_float32_and_a_named_dtype_wins(monkeypatch, flags,
                                                                         auto):
    monkeypatch.setattr(loader, "cpu_flags", lambda: frozenset(flags.split()))
    assert resolve_dtype("fast", "cpu") == auto
    assert resolve_dtype(None, "cpu") == resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("float32", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert resolve_dtype("fast", "meta") == torch.float32  # not a CPU: unchanged


@pytest.mark.parametrize(("flags", "option", "expected"), [
    (AVX2_ONLY, [], "cpu, float32"),
    (ZEN4, [], "cpu, bfloat16"),
    (SAPPHIRE_RAPIDS, [], "cpu, bfloat16"),
    (ZEN4, ["model.dtype=float32"], "cpu, float32"),
    (AVX2_ONLY, ["model.dtype=bfloat16"], "cpu, bfloat16"),
])
def test_memrl_ask_loads_the_cpus_dtype_unless_told(monkeypatch, tiny_model_dir, tmp_path,
                                                     capsys, flags, option, expected):
    monkeypatch.setattr(loader, "cpu_flags", lambda: frozenset(flags.split()))
    doc = tmp_path / "doc.txt"
    doc.write_text("Alice Brightwater was born in Lyon in 1901. " * 4)
    code = main(["ask", "--model", str(tiny_model_dir), "--document", str(doc), "--question",
                 "Where was Alice born?", "memagent.chunk_size=32",
                 "memagent.max_memory_tokens=2", "memagent.max_final_tokens=2",
                 "model.device=cpu", *option])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"tokens/s on {expected}, 1 thread)" in err


def test_memrl_ask_threads(tiny_model_dir, tmp_path):
    """In a process of its own: an in-process vLLM CPU engine built earlier in the same
    process (another test's) replaces torch.set_num_threads with a no-op."""
    import os
    import subprocess
    import sys

    doc = tmp_path / "doc.txt"
    doc.write_text("Alice Brightwater was born in Lyon in 1901.")
    done = subprocess.run(
        [sys.executable, "-m", "memrl", "ask", "--model", str(tiny_model_dir), "--document",
         str(doc), "--question", "Where?", "memagent.max_memory_tokens=2",
         "memagent.max_final_tokens=2", "model.device=cpu", "model.threads=2"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 threads)" in done.stderr


@pytest.mark.parametrize(("dtype", "rows", "onednn"), [("bfloat16", 1, False),
                                                       ("bfloat16", 2, True),
                                                       ("float32", 1, True)])
def test_one_bfloat16_row_decodes_without_onednn(tiny_model_dir, dtype, rows, onednn):
    model, _ = load_pretrained(tiny_model_dir, device="cpu", dtype=dtype)
    with decode_matmuls(model, rows):
        assert torch.backends.mkldnn.enabled is onednn
    assert torch.backends.mkldnn.enabled


def test_a_bfloat16_engine_generates_the_same_tokens_again(tiny_model_dir):
    engine = HFEngine(*load_pretrained(tiny_model_dir, device="cpu", dtype="bfloat16"))
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    first = engine.generate([[1, 2, 3, 4]], params)[0]
    assert len(first.token_ids) == 8 and torch.backends.mkldnn.enabled
    assert engine.generate([[1, 2, 3, 4]], params)[0].token_ids == first.token_ids

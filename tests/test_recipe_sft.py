"""The warm start: the oracle's trajectories, replays of eval files, the SFT loss and recipe."""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import kill_at_first_checkpoint

from memrl.agents.memagent import MemAgent, MemAgentConfig
from memrl.agents.oracle import OracleGenerator, needed_facts, oracle_memory, replay_memagent
from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.recipes import sft
from memrl.recipes.sft_config import SFTConfig
from memrl.run.metrics import read_metrics
from memrl.tasks.memagent_qa import MemAgentQATask, trajectory_row

AGENT = MemAgentConfig(chunk_size=40, max_memory_tokens=64, max_final_tokens=24, temperature=0)


def test_sft_loss_is_the_token_mean_nll_of_response_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -7.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # (1 + 2 + 0.5) / 3 response tokens; masked positions (-9, -7) do not count.
    assert sft.sft_loss(logprobs, mask, 3).item() == pytest.approx(3.5 / 3)
    # Micro-batches divided by the step's token count add up to the step's mean.
    halves = sft.sft_loss(logprobs[:1], mask[:1], 3) + sft.sft_loss(logprobs[1:], mask[1:], 3)
    assert halves.item() == pytest.approx(3.5 / 3)


def test_needed_facts_and_oracle_memory_by_hand():
    from memrl.data.records import Document, QARecord

    record = QARecord(id="q", question="In which country was Kovan born?", answers=["Zarnia"],
                      documents=[
                          Document(title="Tamo", text="Tamo speaks Quellic.", is_supporting=False),
                          Document(title="Kovan", text="Kovan was born in Brastor. He sings.",
                                   is_supporting=True),
                          Document(title="Brastor", text="Brastor is in Zarnia! Old town.",
                                   is_supporting=True),
                      ])
    assert needed_facts(record) == ["Kovan was born in Brastor.", "Brastor is in Zarnia!"]
    fact = "Kovan was born in Brastor."
    assert oracle_memory([fact], "nothing here", "No previous memory") == "No previous memory"
    assert oracle_memory(["B b.", "A a."], "x A a. y B b.", "-") == "A a. B b."
    assert oracle_memory(["A a."], "x A", "-") == "-"  # cut by a chunk boundary: not yet


@settings(max_examples=60, deadline=None)
@given(
    facts=st.lists(st.text(alphabet="abc .", min_size=1, max_size=6), max_size=4),
    read=st.text(alphabet="abc .", max_size=30),
)
def test_oracle_memory_holds_exactly_the_facts_read(facts, read):
    memory = oracle_memory(facts, read, "NONE")
    present = [f for f in dict.fromkeys(facts) if f in read]
    if not present:
        assert memory == "NONE"
    else:
        assert memory == " ".join(sorted(present, key=lambda f: (read.find(f), f)))


def test_oracle_rollout_scores_full_marks_and_ends_turns_with_eos(tiny_tokenizer):
    records = make_synthetic_records(3, num_docs=4, seed=2, hops=1)
    oracle = OracleGenerator(tiny_tokenizer, records, AGENT)
    trajs = MemAgentQATask(AGENT).rollout(oracle, records, num_samples=1, seed=0)
    for t, r in zip(trajs, records, strict=True):
        assert t.reward == 1.0 and t.answer == r.answers[0]
        assert t.details.memories[-1] == needed_facts(r)[0]
        assert all(turn.response_ids[-1] == tiny_tokenizer.eos_token_id for turn in t.turns)
        assert t.details.num_chunks >= 2  # several memory updates per episode


def test_oracle_refuses_records_without_supporting_documents(tiny_tokenizer):
    from memrl.data.records import QARecord

    bare = QARecord(id="q1", question="Who?", answers=["A"], context="A did it.")
    with pytest.raises(MemrlInputError, match="no supporting documents"):
        OracleGenerator(tiny_tokenizer, [bare], AGENT)


def test_replay_rebuilds_the_exact_turns_of_a_logged_trajectory(tiny_tokenizer):
    records = make_synthetic_records(2, num_docs=4, seed=3, hops=1)
    oracle = OracleGenerator(tiny_tokenizer, records, AGENT)
    trajs = MemAgentQATask(AGENT).rollout(oracle, records, num_samples=1, seed=0)
    agent = MemAgent(oracle, AGENT)
    for t, r in zip(trajs, records, strict=True):
        row = json.loads(json.dumps(trajectory_row(t, r)))  # as a trajectories file holds it
        replayed = replay_memagent(agent, r, row)
        assert [x.prompt_ids for x in replayed.turns] == [x.prompt_ids for x in t.turns]
        assert [x.response_ids for x in replayed.turns] == [x.response_ids for x in t.turns]
    other = MemAgent(oracle, AGENT.model_copy(update={"chunk_size": 400}))
    with pytest.raises(MemrlInputError, match="chunk_size"):
        replay_memagent(other, records[0], trajectory_row(trajs[0], records[0]))


@pytest.fixture()
def sft_data(tmp_path, tiny_tokenizer) -> Path:
    records = make_synthetic_records(6, num_docs=3, seed=4, hops=1)
    save_records_jsonl(records, tmp_path / "train.jsonl")
    save_records_jsonl(make_synthetic_records(2, num_docs=3, seed=5, hops=1),
                       tmp_path / "val.jsonl")
    return tmp_path


def sft_yaml(path: Path, model_dir: Path, data_dir: Path, out: Path, **extra) -> Path:
    cfg = {
        "model": {"path": str(model_dir)},
        "data": {"train_file": str(data_dir / "train.jsonl"),
                 "val_file": str(data_dir / "val.jsonl"),
                 **extra.pop("data", {})},
        "memagent": {"chunk_size": 40, "max_memory_tokens": 64, "max_final_tokens": 24},
        "sft": {"batch_size": 2, "micro_batch_size": 3},
        "optim": {"lr": 1e-3, "warmup_steps": 2},
        "trainer": {"out_dir": str(out), "log_sinks": ["jsonl"], "test_freq": 2, **extra},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_sft_lowers_the_nll_of_the_oracle(tiny_model_dir, sft_data, tmp_path):
    cfg = load_config(SFTConfig, sft_yaml(tmp_path / "c.yaml", tiny_model_dir, sft_data,
                                          tmp_path / "run", total_steps=6))
    state = sft.train(cfg)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert state.step == 6 and [r["step"] for r in rows] == list(range(7))
    vals = [r["val/nll"] for r in rows if "val/nll" in r]
    assert vals[-1] < vals[0]
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()


def test_sft_on_a_filtered_trajectories_file(tiny_model_dir, sft_data, tmp_path, capsys):
    """Rejection sampling: only lines scoring >= --min-score are trained on."""
    from memrl.data.hotpotqa import load_hotpotqa
    from memrl.inference.loader import load_tokenizer

    records = load_hotpotqa(sft_data / "train.jsonl")
    tok = load_tokenizer(tiny_model_dir)
    trajs = MemAgentQATask(AGENT).rollout(OracleGenerator(tok, records, AGENT), records,
                                          num_samples=1, seed=0)
    rows = [trajectory_row(t, r) for t, r in zip(trajs, records, strict=True)]
    for row in rows[:4]:  # these four "failed": the teacher's answer was wrong
        row["scores"]["sub_em"] = 0.0
    file = tmp_path / "trajectories_3.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = sft_yaml(tmp_path / "c.yaml", tiny_model_dir, sft_data, tmp_path / "run",
                   total_steps=1, data={"trajectories": str(file)})
    assert cli_main(["sft", str(cfg), "--min-score", "1"]) == 0
    run = sft.setup(load_config(SFTConfig, cfg, ["data.min_score=1", "trainer.out_dir=" +
                                                  str(tmp_path / "other")]))
    assert sorted(t.record_id for t in run.stream.records) == [r["id"] for r in rows[4:]]
    assert cli_main(["sft", str(cfg), "--min-score", "2", "trainer.out_dir=" +
                     str(tmp_path / "none")]) == 2
    assert "no trajectory scores sub_em >= 2.0" in capsys.readouterr().err


@pytest.mark.slow
def test_sft_resumes_after_sigkill_like_an_uninterrupted_run(tiny_model_dir, sft_data,
                                                             tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    ref = sft_yaml(tmp_path / "ref.yaml", tiny_model_dir, sft_data, tmp_path / "ref",
                   total_steps=8, save_freq=2)
    assert cli_main(["sft", str(ref)]) == 0
    cfg = sft_yaml(tmp_path / "kill.yaml", tiny_model_dir, sft_data, tmp_path / "kill",
                   total_steps=8, save_freq=2)
    kill_at_first_checkpoint([sys.executable, "-m", "memrl", "sft", str(cfg)], env,
                             tmp_path / "kill")
    assert cli_main(["sft", str(cfg)]) == 2  # a used out_dir needs --resume
    assert cli_main(["sft", str(cfg), "--resume"]) == 0
    def drop(rows):
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")}
                for r in rows]

    want = drop(read_metrics(tmp_path / "ref" / "metrics.jsonl"))
    got = drop(read_metrics(tmp_path / "kill" / "metrics.jsonl"))
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(9))
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12), (a["step"], k)


def test_turn_kinds_keeps_only_the_chosen_turns(tiny_model_dir, sft_data, tmp_path):
    cfg = load_config(SFTConfig, sft_yaml(tmp_path / "c.yaml", tiny_model_dir, sft_data,
                                          tmp_path / "run", total_steps=1),
                      ["sft.turn_kinds=[final]"])
    run = sft.setup(cfg)
    assert {turn.kind for t in run.stream.records for turn in t.turns} == {"final"}
    assert all(len(t.turns) == 1 for t in [*run.stream.records, *run.val])


def test_sft_uses_the_mixed_precision_of_model_dtype_auto():
    """`model.dtype: auto` trains float32 weights under bfloat16 autocast on CUDA, in SFT as
    in the RL actor; on a CPU, and for a named dtype, no autocast."""
    from memrl.recipes.config import ModelConfig
    from memrl.recipes.models import autocast

    auto, fp32 = ModelConfig(path="m"), ModelConfig(path="m", dtype="float32")
    with warnings.catch_warnings():  # "CUDA is not available" on a CPU-only machine
        warnings.simplefilter("ignore")
        ctx = autocast(auto, torch.device("cuda"))
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16
    for cfg, device in ((auto, torch.device("cpu")), (fp32, torch.device("cuda"))):
        assert not isinstance(autocast(cfg, device), torch.autocast)

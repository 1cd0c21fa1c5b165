"""A state-tracking benchmark is training data for `memrl sft` and `memrl train` (the MemAgent
QA task): two GRPO steps on `memrl prepare where-now`'s files; the state an overwrite memory
should hold (`state_facts`), which the warm start's oracle writes; and a learning check of
the where-now recipe on the tiny model (`pipeline`)."""

from __future__ import annotations

import json

import pytest
from helpers import TINY_MEMAGENT
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.cli import main
from memrl.data.state_tracking import SPLITS, state_facts, state_items
from memrl.run.metrics import read_metrics


def test_two_grpo_steps_on_where_now(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "where-now"
    assert main(["prepare", "where-now", "--out", str(data), "split=train",
                 "train_questions=8", "val_questions=2", "train_docs=2"]) == 0
    config = tmp_path / "train.yaml"
    config.write_text(
        f"model:\n  path: {tiny_model_dir}\n"
        f"data:\n  train_file: {data / 'train.json'}\n  val_file: {data / 'val.json'}\n"
        "  format: ruler\n  train_batch_size: 2\n"
        f"trainer:\n  out_dir: {tmp_path / 'run'}\n  total_steps: 2\n  test_freq: 2\n"
        "  save_freq: 2\n  log_sinks: [jsonl]\n"
        "rollout:\n  n: 2\nrl:\n  ppo_mini_batch_size: 2\n  use_kl_loss: false\n"
    )
    assert main(["train", str(config), *TINY_MEMAGENT]) == 0, capsys.readouterr().err
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [r for r in rows if "train/reward_mean" in r]
    assert len(steps) == 2
    validation = [r for r in rows if "val/accuracy" in r]
    assert validation and 0.0 <= validation[-1]["val/accuracy"] <= 1.0


def test_memrl_eval_reads_the_benchmark(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "counting"
    assert main(["prepare", "counting", "--out", str(data), "split=eval",
                 "eval_questions=2", "num_docs=[1,2]"]) == 0
    out = tmp_path / "eval"
    entry = json.dumps({"name": "ruler-hqa", "data_dir": str(data), "num_docs": [1, 2],
                        "protocol": "memagent-boxed"})
    assert main(["eval", f"model.path={tiny_model_dir}", f"eval.benchmarks=[{entry}]",
                 f"eval.out_dir={out}", "eval.progress=false", "memagent.chunk_size=64",
                 "memagent.max_chunks=2", "memagent.max_memory_tokens=4",
                 "memagent.max_final_tokens=4"]) == 0, capsys.readouterr().err
    out = out / "ruler-hqa"
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["results"], key=int) == ["1", "2"]
    assert all(r["n"] == 2 for r in results["results"].values())
    rows = [json.loads(line) for line in (out / "trajectories_2.jsonl").read_text().splitlines()]
    assert all(row["evidence"] for row in rows)  # where the gold facts enter the chunks
    # the whole-document baseline reads the same files
    base = tmp_path / "long"
    assert main(["eval", "agent=long-context", f"model.path={tiny_model_dir}",
                 f"eval.benchmarks=[counting={data}]", "eval.num_docs=[1]",
                 f"eval.out_dir={base}", "long_context.max_new_tokens=4"]) == 0
    assert json.loads((base / "counting" / "results.json").read_text())["results"]["1"]["n"] == 2


# ---------------------------------------------------------------------------------------------
# The state an overwrite memory should hold (memrl.data.state_tracking.state_facts) and the
# warm start's oracle that writes it.


TRACKED_TASKS = ("where-now", "who-has", "counting", "knowledge-update")


def test_state_facts_by_hand():
    text = ("Mary went to the kitchen. Filler about Lisbon. John moved to the garden. "
            "Mary journeyed to the cellar. John picked up the apple. Mary lives in Oslo. "
            "Mary has since moved to Vienna. John gave the apple to")  # cut mid-sentence
    assert state_facts("Where is Mary?", text) == ["Mary journeyed to the cellar."]
    assert state_facts("Where is Mary?", text[:30]) == ["Mary went to the kitchen."]
    assert state_facts("Where is Sandra?", text) == []  # nothing about her yet
    assert state_facts("Who has the apple now?", text) == ["John picked up the apple."]
    assert state_facts("Where does Mary live now?", text) == ["Mary has since moved to Vienna."]
    assert state_facts("How many times did Mary go to the kitchen?", text) == [
        "Mary went to the kitchen."]
    assert state_facts("How many objects is John carrying now?", text) == [
        "John picked up the apple."]
    # a trail (where-before) and any other question are no tracked state
    assert state_facts("Where was the apple before the garden?", text) is None
    assert state_facts("Which country was the author of Hamlet born in?", text) is None


@settings(max_examples=80, deadline=None)
@given(task=st.sampled_from(TRACKED_TASKS), index=st.integers(0, 5000),
       split=st.sampled_from(SPLITS), n=st.integers(1, 12), cut=st.floats(0, 1))
def test_state_facts_rederive_the_gold_facts_and_every_earlier_state(task, index, split, n, cut):
    item = state_items(task, 1, n, split=split, start=index)[0]
    assert state_facts(item["input"], item["context"]) == item["facts"]
    if task == "where-now":  # on any prefix: the asked person's latest move read so far
        person = item["facts"][0].split()[0]
        end = int(cut * len(item["context"]))
        read = [e for e, p in zip(item["events"], item["event_positions"], strict=True)
                if p + len(e) <= end and e.startswith(person + " ")]
        assert state_facts(item["input"], item["context"][:end]) == read[-1:]


_SENTENCES = st.sampled_from([
    "Mary gave the apple to John.", "John took the apple.", "Mary dropped the apple.",
    "Mary went to the kitchen.", "Mary lives in Oslo.", "Mary has since become a nurse.",
    "Mary went to the", "went to the kitchen.", "Julia gave Thomas the key."])


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.one_of(_SENTENCES, st.text(max_size=20)), max_size=12),
       question=st.sampled_from(["Where is Mary?", "Who has the apple now?",
                                 "How many objects is John carrying now?",
                                 "What is the job of Mary now?", "Who wrote Hamlet?"]))
def test_state_facts_reads_any_text(pieces, question):
    """Events in any order (a give before any take, cut sentences, noise) never break it:
    it returns sentences of the text, or None for a question it does not track."""
    text = " ".join(pieces)
    facts = state_facts(question, text)
    assert facts is None if question == "Who wrote Hamlet?" else all(f in text for f in facts)


def test_the_oracle_overwrites_the_memory_on_where_now(tiny_tokenizer, tmp_path):
    from memrl.agents.memagent import MemAgentConfig
    from memrl.agents.oracle import OracleGenerator
    from memrl.data.ruler_hqa import load_ruler_hqa
    from memrl.tasks.memagent_qa import MemAgentQATask

    config = MemAgentConfig(chunk_size=64, max_memory_tokens=64, max_final_tokens=24,
                            temperature=0)
    items = state_items("where-now", 12, 3, split="train")
    (tmp_path / "train.json").write_text(json.dumps(items))
    records = load_ruler_hqa(tmp_path / "train.json")
    assert len({r.question for r in records}) < len(records)  # questions repeat
    trajs = MemAgentQATask(config).rollout(OracleGenerator(tiny_tokenizer, records, config),
                                           records, num_samples=1, seed=0)
    overwritten = 0
    for t, item in zip(trajs, items, strict=True):
        assert t.reward == 1.0 and t.details.memories[-1] == item["facts"][0]
        overwritten += any(f"the {old}." in m for m in t.details.memories
                           for old in item["superseded"])
    assert overwritten >= 6  # most episodes first hold a place that a later move replaces


# ---------------------------------------------------------------------------------------------
# The learning check: the recipe of configs/where_now_tiny*.yaml (warm start) teaches the tiny
# model to keep the asked person's latest move in memory and answer from it, on where-now
# stories it never saw (training names and places: the 0.4M-parameter model does not copy
# names of the held-out split it has never read; docs/lab/results.md has both).

def _held_out(tmp_path, model_dir, name, cfg) -> tuple[float, float]:
    """EM on 48 unseen training-split stories at N = 1, and the share of episodes whose
    last memory is a sentence about the asked person."""
    from rich.console import Console

    from memrl.data.state_tracking import parse_question
    from memrl.eval.ruler_hqa import evaluate_ruler_hqa
    from memrl.inference.hf import HFEngine
    from memrl.inference.loader import load_pretrained

    data = tmp_path / "held_out"
    if not data.exists():
        data.mkdir()
        items = state_items("where-now", 48, 1, split="train", start=50_000)
        (data / "eval_1.json").write_text(json.dumps(items))
    engine = HFEngine(*load_pretrained(model_dir, device="cpu"), generation_batch_size=48)
    agent = cfg.memagent.model_copy(update={"seed": cfg.seed, "temperature": 0.0})
    results = evaluate_ruler_hqa(engine, data, [1], config=agent, out_dir=tmp_path / name,
                                 model_name=str(model_dir), console=Console(quiet=True))
    rows = [json.loads(line) for line in
            (tmp_path / name / "trajectories_1.jsonl").read_text().splitlines()]
    about = [r["memories"][-1].startswith(parse_question(r["question"])[1]["p"] + " ")
             for r in rows]
    return results["results"]["1"]["em"], sum(about) / len(rows)


@pytest.mark.pipeline
@pytest.mark.slow
def test_the_where_now_warm_start_learns_to_keep_the_asked_state(tmp_path):
    from memrl.config import load_config
    from memrl.models.tiny import build_tiny_model
    from memrl.recipes import sft
    from memrl.recipes.config import TrainConfig
    from memrl.recipes.sft_config import SFTConfig
    from memrl.run.checkpoint import export_checkpoint, latest_checkpoint

    data = tmp_path / "data"
    assert main(["prepare", "where-now", "--out", str(data), "split=train",
                 "train_docs=1", "train_questions=400", "val_questions=0"]) == 0
    build_tiny_model(tmp_path / "model", seed=0)
    cfg = load_config(TrainConfig, "configs/where_now_tiny.yaml", [
        f"model.path={tmp_path / 'model'}", f"data.train_file={data / 'train.json'}",
        "data.val_file=null", f"trainer.out_dir={tmp_path / 'rl'}"])
    em_before, about_before = _held_out(tmp_path, tmp_path / "model", "before", cfg)
    sft.train(load_config(SFTConfig, "configs/where_now_tiny_sft.yaml", [
        f"model.path={tmp_path / 'model'}", f"data.train_file={data / 'train.json'}",
        f"trainer.out_dir={tmp_path / 'sft'}", "trainer.log_sinks=[jsonl]"]))
    export_checkpoint(latest_checkpoint(tmp_path / "sft" / "checkpoints"), tmp_path / "warm")
    em_after, about_after = _held_out(tmp_path, tmp_path / "warm", "warm", cfg)
    assert em_before <= 0.02 and about_before <= 0.02, (em_before, about_before)
    # Measured (seeds 0 and 1, docs/lab/results.md): last memory about the asked person
    # 0.71 / 0.81, EM 0.146 / 0.146 (7 of 48); the untrained model 0 and 0.
    assert about_after >= 0.40, (about_before, about_after)
    assert em_after >= 0.06, (em_before, em_after)

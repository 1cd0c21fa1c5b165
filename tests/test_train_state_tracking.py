"""A state-tracking benchmark is training data for `memrl train` (the MemAgent QA task):
two GRPO steps on `memrl prepare where-now`'s train.json / val.json, on the tiny model."""

from __future__ import annotations

from helpers import TINY_MEMAGENT

from memrl.cli import main
from memrl.run.metrics import read_metrics


def test_two_grpo_steps_on_where_now(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "where-now"
    assert main(["prepare", "where-now", "--out", str(data), "--split", "train",
                 "--train-questions", "8", "--val-questions", "2", "--train-docs", "2"]) == 0
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


def test_memrl_eval_ruler_hqa_reads_the_benchmark(tiny_model_dir, tmp_path, capsys):
    import json

    data = tmp_path / "counting"
    assert main(["prepare", "counting", "--out", str(data), "--split", "eval",
                 "--eval-questions", "2", "--num-docs", "1", "--num-docs", "2"]) == 0
    out = tmp_path / "eval"
    assert main(["eval", "ruler-hqa", "--model", str(tiny_model_dir), "--data", str(data),
                 "--num-docs", "1", "--num-docs", "2", "--out", str(out), "--quiet",
                 "--chunk-size", "64", "--max-chunks", "2", "--max-memory-tokens", "4",
                 "--max-final-tokens", "4"]) == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["results"], key=int) == ["1", "2"]
    assert all(r["n"] == 2 for r in results["results"].values())
    rows = [json.loads(line) for line in (out / "trajectories_2.jsonl").read_text().splitlines()]
    assert all(row["evidence"] for row in rows)  # where the gold facts enter the chunks
    # the whole-document baseline reads the same files
    base = tmp_path / "long"
    assert main(["eval", "long-context", "--model", str(tiny_model_dir), "--data", str(data),
                 "--num-docs", "1", "--out", str(base), "--max-new-tokens", "4"]) == 0
    assert json.loads((base / "results.json").read_text())["results"]["1"]["n"] == 2


# ---------------------------------------------------------------------------------------------
# The state an overwrite memory should hold (memrl.data.state_tracking.state_facts) and the
# warm start's oracle that writes it.

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import json  # noqa: E402

from memrl.data.state_tracking import SPLITS, state_facts, state_items  # noqa: E402

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

"""The training / held-out split of LoCoMo's conversations: by sample id, the same in any file
order and on a file that holds one side already; `memrl prepare locomo split=...` writes each
side, and on the real file the two sides share no conversation and no session."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest

from memrl.cli import main
from memrl.data.locomo import (
    HELDOUT_CONVERSATIONS,
    check_split,
    load_episodes,
    load_locomo,
    split_by_conversation,
    split_conversations,
)
from memrl.errors import MemrlInputError

LOCOMO_IDS = ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43", "conv-44", "conv-47",
              "conv-48", "conv-49", "conv-50"]


def test_split_by_sample_id_in_any_order():
    ids = ["conv-50", "conv-26", "conv-50", "conv-48", "x", "conv-30", "conv-49"]
    assert split_conversations(ids, "heldout") == ["conv-50", "conv-48", "conv-49"]
    assert split_conversations(ids, "train") == ["conv-26", "x", "conv-30"]
    assert split_conversations(ids, "all") == ["conv-50", "conv-26", "conv-48", "x", "conv-30",
                                               "conv-49"]
    # applying the split to one side keeps that side whole
    held = split_conversations(LOCOMO_IDS, "heldout")
    assert held == list(HELDOUT_CONVERSATIONS) == split_conversations(held, "heldout")
    assert split_conversations(held, "train") == []
    assert len(split_conversations(LOCOMO_IDS, "train")) == 7


def test_unknown_split_is_an_error():
    for name in ("dev", "test"):
        with pytest.raises(MemrlInputError, match=f"unknown split '{name}'; choose one of all, "
                           "train, heldout"):
            check_split(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_split("train") == "train"


def test_the_real_file_splits_7_3_with_no_shared_session(shared_data):
    episodes, _ = load_locomo(shared_data / "locomo" / "locomo10.json")
    train, held = split_by_conversation(episodes, "train"), split_by_conversation(episodes,
                                                                                  "heldout")
    assert len(train) + len(held) == len(episodes) == 1982
    assert {e.sample_id for e in held} == set(HELDOUT_CONVERSATIONS)
    assert len({e.sample_id for e in train}) == 7
    # no held-out dialogue turn or memory fact is in any training episode
    held_turns = {(t.text, t.date) for e in held for t in e.dialogue}
    train_turns = {(t.text, t.date) for e in train for t in e.dialogue}
    assert not held_turns & train_turns
    # the docs' counts (docs/protocols.md): answerable questions per category on each side
    count = lambda eps: Counter(e.category for e in eps)  # noqa: E731
    assert [count(held)[c] for c in (1, 2, 3, 4, 5)] == [90, 107, 28, 278, 134]
    assert [count(train)[c] for c in (1, 2, 3, 4, 5)] == [192, 214, 64, 563, 312]
    for c in (1, 2, 3, 4):
        assert abs(count(held)[c] / 503 - count(train)[c] / 1033) < 0.008


def test_cli_prepare_writes_one_side(shared_data, tmp_path, capsys):
    src = shared_data / "locomo" / "locomo10.json"
    for split, n, ids in (("heldout", 637, set(HELDOUT_CONVERSATIONS)),
                          ("train", 1345, set(LOCOMO_IDS) - set(HELDOUT_CONVERSATIONS))):
        out = tmp_path / split
        assert main(["prepare", "locomo", "--input", str(src), "--out", str(out),
                     f"split={split}"]) == 0
        assert f"(split {split}: {len(ids)} conversations)" in capsys.readouterr().out
        episodes = load_episodes(out)
        assert len(episodes) == n and {e.sample_id for e in episodes} == ids
        skipped = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
        assert {s["sample_id"] for s in skipped} <= ids


def test_cli_prepare_split_errors_are_one_line(tmp_path, capsys):
    src = tmp_path / "one.json"
    src.write_text(json.dumps([{
        "sample_id": "conv-1", "conversation": {"session_1": [
            {"speaker": "A", "dia_id": "D1:1", "text": "I moved to Oslo."}],
            "session_1_date_time": "1 May 2023"},
        "observation": {}, "qa": [{"question": "Where?", "answer": "Oslo",
                                   "evidence": ["D1:1"], "category": 4}]}]))
    out = str(tmp_path / "out")
    assert main(["prepare", "locomo", "--input", str(src), "--out", out,
                 "split=heldout"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no episodes of the held-out conversations (conv-48" in err[0]
    assert main(["prepare", "locomo", "--input", str(src), "--out", out, "split=dev"]) == 2
    assert "split: must be one of all, train, heldout, got 'dev'" in capsys.readouterr().err

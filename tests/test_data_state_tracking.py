"""The state-tracking benchmarks (memrl.data.state_tracking): a reference solver that reads
only the context and the question re-derives every gold answer; determinism; nesting
across lengths; disjoint train / eval pools; facts in order at their recorded positions."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.data.ruler_hqa import load_ruler_hqa, load_ruler_hqa_dir
from memrl.data.state_tracking import (
    CITIES,
    EVENT_FORMS,
    JOBS,
    OBJECTS,
    PEOPLE,
    PLACES,
    QUESTION_FORMS,
    SPLITS,
    TASKS,
    StateFiles,
    read_haystack,
    state_items,
    write_state_tracking,
)
from memrl.errors import MemrlInputError

# ---------------------------------------------------------------------------------------------
# The reference solver: regular expressions over the published forms, and a plain simulation.


def _alternation(words) -> str:
    return "(?:" + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + ")"


SLOTS = {
    "p": _alternation(PEOPLE["train"] + PEOPLE["eval"]),
    "q": _alternation(PEOPLE["train"] + PEOPLE["eval"]),
    "l": _alternation(PLACES["train"] + PLACES["eval"]),
    "o": _alternation(OBJECTS["train"] + OBJECTS["eval"]),
    "v": _alternation(CITIES["train"] + CITIES["eval"]),
    "a": "an? " + _alternation(JOBS["train"] + JOBS["eval"]),
}


def _pattern(form: str) -> re.Pattern[str]:
    text = re.escape(form)
    for slot, words in SLOTS.items():
        group = f"(?P<{slot}>{words})" if slot != "a" else f"an? (?P<a>{words[4:]})"
        text = text.replace(re.escape("{" + slot + "}"), group)
    return re.compile(r"(?<![\w])" + text)


EVENT_PATTERNS = [(kind, _pattern(f)) for kind, by_split in EVENT_FORMS.items()
                  for forms in by_split.values() for f in forms]
QUESTION_PATTERNS = [(kind, re.compile(_pattern(f).pattern + "$")) for kind, by_split in
                     QUESTION_FORMS.items() for forms in by_split.values() for f in forms]


def parse_events(context: str) -> list[tuple[int, str, dict[str, str]]]:
    """Every event sentence of the context: (offset, kind, slots), in reading order."""
    found = {}
    for kind, pattern in EVENT_PATTERNS:
        for m in pattern.finditer(context):
            assert m.start() not in found, f"two readings at {m.start()}"
            found[m.start()] = (kind, {k: v for k, v in m.groupdict().items() if v})
    return [(pos, *found[pos]) for pos in sorted(found)]


def parse_question(question: str) -> tuple[str, dict[str, str]]:
    readings = [(kind, m.groupdict()) for kind, p in QUESTION_PATTERNS
                if (m := p.match(question))]
    assert len(readings) == 1, question
    kind, slots = readings[0]
    return kind, {k: v for k, v in slots.items() if v}


def solve(context: str, question: str) -> str:
    """The answer, from the sentences of the context alone."""
    kind, asked = parse_question(question)
    place, holder, obj_place, trail, visits, values = {}, {}, {}, {}, {}, {}

    def locate(o, where):
        obj_place[o] = where
        if not trail.get(o) or trail[o][-1] != where:
            trail.setdefault(o, []).append(where)

    for _, event, s in parse_events(context):
        if event == "move":
            place[s["p"]] = s["l"]
            visits[(s["p"], s["l"])] = visits.get((s["p"], s["l"]), 0) + 1
            for o, h in holder.items():
                if h == s["p"]:
                    locate(o, s["l"])
        elif event == "take":
            holder[s["o"]] = s["p"]
            locate(s["o"], place[s["p"]])
        elif event == "give":
            assert holder[s["o"]] == s["p"] and place[s["q"]] == place[s["p"]]
            holder[s["o"]] = s["q"]
        elif event == "drop":
            holder[s["o"]] = None
        else:
            values[(s["p"], event)] = s.get("v") or s.get("a")
    if kind == "where-now":
        return place[asked["p"]]
    if kind == "where-before":
        path = trail[asked["o"]]
        assert path.count(asked["l"]) == 1
        return path[path.index(asked["l"]) - 1]
    if kind == "who-has":
        return holder[asked["o"]]
    if kind == "count-visits":
        return str(visits.get((asked["p"], asked["l"]), 0))
    if kind == "count-held":
        return str(sum(1 for h in holder.values() if h == asked["p"]))
    return values[(asked["p"], kind)]


# ---------------------------------------------------------------------------------------------

cases = st.tuples(st.sampled_from(TASKS), st.integers(0, 3), st.integers(0, 5000),
                  st.sampled_from(SPLITS), st.integers(1, 40))


@settings(max_examples=150, deadline=None)
@given(case=cases)
def test_reference_solver_rederives_every_answer(case):
    task, seed, index, split, n = case
    item = state_items(task, 1, n, seed=seed, split=split, start=index)[0]
    assert solve(item["context"], item["input"]) == item["answers"][0]
    # the solver finds exactly the story's events, where the item says they are
    parsed = parse_events(item["context"])
    assert [p for p, _, _ in parsed] == item["event_positions"]
    # the facts alone (in order) determine the answer as well, for the one-state questions
    if task in ("where-now", "who-has", "knowledge-update"):
        assert item["answers"][0] in item["facts"][-1]
    assert item["answers"][0] not in item["superseded"]
    assert item["superseded"] or task == "where-before"


@settings(max_examples=60, deadline=None)
@given(case=cases)
def test_facts_appear_in_order_at_their_positions(case):
    task, seed, index, split, n = case
    item = state_items(task, 1, n, seed=seed, split=split, start=index)[0]
    context = item["context"]
    for texts, positions in ((item["facts"], item["fact_positions"]),
                             (item["events"], item["event_positions"])):
        assert positions == sorted(set(positions))
        for text, pos in zip(texts, positions, strict=True):
            assert context[pos:pos + len(text)] == text
    assert set(item["fact_positions"]) <= set(item["event_positions"])
    assert item["num_docs"] == n and len(context.split("\n\n")) == n


def filler_blocks(item) -> list[str]:
    """The context's filler: the event sentences cut out, paragraph by paragraph."""
    context, cut = item["context"], 0
    kept = []
    for text, pos in zip(item["events"], item["event_positions"]):
        kept.append(context[cut:pos])
        cut = pos + len(text)
    kept.append(context[cut:])
    return [" ".join(p.split()) for p in "".join(kept).split("\n\n")]


@settings(max_examples=30, deadline=None)
@given(task=st.sampled_from(TASKS), index=st.integers(0, 999), small=st.integers(1, 30),
       extra=st.integers(1, 60))
def test_nested_across_lengths(task, index, small, extra):
    a = state_items(task, 1, small, split="eval", start=index)[0]
    b = state_items(task, 1, small + extra, split="eval", start=index)[0]
    for key in ("index", "input", "answers", "facts", "events", "superseded", "task"):
        assert a[key] == b[key]
    assert filler_blocks(b)[:small] == filler_blocks(a)
    # an event's depth is kept: its paragraph is at the same fraction of the document
    for pa, pb in zip(a["event_positions"], b["event_positions"]):
        da = a["context"][:pa].count("\n\n") / small
        db = b["context"][:pb].count("\n\n") / (small + extra)
        assert abs(da - db) <= 1 / small + 1 / (small + extra)


def test_deterministic_and_byte_stable(tmp_path):
    spec = StateFiles(train_questions=5, val_questions=2, eval_questions=3, eval_docs=(4, 8))
    first = write_state_tracking("who-has", tmp_path / "a", spec)
    second = write_state_tracking("who-has", tmp_path / "b", spec)
    assert [p.name for p in first] == ["train.json", "val.json", "eval_4.json", "eval_8.json"]
    for x, y in zip(first, second):
        assert x.read_bytes() == y.read_bytes()
    other = write_state_tracking("who-has", tmp_path / "c", StateFiles(
        seed=1, train_questions=5, val_questions=2, eval_questions=3, eval_docs=(4, 8)))
    assert other[0].read_bytes() != first[0].read_bytes()
    # the question i of a file does not depend on how many are written
    assert state_items("who-has", 3, 4)[1] == state_items("who-has", 1, 4, start=1)[0]


def _words(text: str, vocabulary) -> set[str]:
    return {w for w in vocabulary if re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text)}


def test_train_and_eval_pools_are_disjoint():
    for table in (PEOPLE, PLACES, OBJECTS, CITIES, JOBS):
        assert not set(table["train"]) & set(table["eval"])
    for forms in (*EVENT_FORMS.values(), *QUESTION_FORMS.values()):
        assert not set(forms["train"]) & set(forms["eval"])
    for task in TASKS:
        for split, other in (("train", "eval"), ("eval", "train")):
            for item in state_items(task, 40, 1, split=split):
                story = " ".join([item["input"], *item["events"]])
                for table in (PEOPLE, PLACES, OBJECTS, CITIES, JOBS):
                    assert not _words(story, table[other]), (task, split, story)
                forms = [f for kind in EVENT_FORMS.values() for f in kind[other]]
                own = [f for kind in EVENT_FORMS.values() for f in kind[split]]
                for sentence in item["events"]:
                    assert any(_pattern(f).fullmatch(sentence) for f in own)
                    assert not any(_pattern(f).fullmatch(sentence) for f in forms)


def test_validation_questions_are_not_evaluation_questions(tmp_path):
    paths = write_state_tracking("where-now", tmp_path, StateFiles(
        train_questions=3, val_questions=4, eval_questions=4, eval_docs=(2,)))
    val = json.loads(paths[1].read_text())
    ev = json.loads(paths[2].read_text())
    assert {i["index"] for i in val}.isdisjoint({i["index"] for i in ev})
    train = load_ruler_hqa(paths[0])
    assert [r.num_docs for r in train] == [10, 10, 10]


def test_user_haystack_blocks_skip_story_names(tmp_path):
    book = tmp_path / "book.txt"
    sentences = [f"Sentence number {k} of a long book is here." for k in range(300)]
    sentences[5] = "Mary went to the kitchen in this book."
    book.write_text("\n".join(sentences))
    filler = read_haystack(book, block_chars=100)
    assert all("Mary" not in b and len(b) >= 100 for b in filler.blocks)
    item = state_items("where-now", 1, 5, split="train", filler=filler)[0]
    assert solve(item["context"], item["input"]) == item["answers"][0]
    assert all(b in filler.blocks for b in filler_blocks(item))
    with pytest.raises(MemrlInputError, match="needs 500 filler blocks"):
        state_items("where-now", 1, 500, filler=filler)


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(MemrlInputError, match="unknown benchmark"):
        state_items("where-then", 1, 4)
    with pytest.raises(MemrlInputError, match="num_docs must be an integer of at least 1"):
        state_items("counting", 1, 0)
    with pytest.raises(MemrlInputError, match="split must be one of"):
        write_state_tracking("counting", tmp_path, StateFiles(split="test"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not text")
    with pytest.raises(MemrlInputError, match="not UTF-8"):
        read_haystack(bad)
    assert not list(tmp_path.glob("*.json"))


def test_prepare_cli_writes_files_eval_reads(tmp_path, capsys):
    from memrl.cli import main

    out = tmp_path / "kn"
    assert main(["prepare", "knowledge-update", "--out", str(out), "train_questions=4",
                 "val_questions=2", "eval_questions=3", "num_docs=[4,16]"]) == 0
    assert "wrote" in capsys.readouterr().out
    files = load_ruler_hqa_dir(out, [4, 16])
    assert [r.question for r in files[4]] == [r.question for r in files[16]]
    assert len(files[16][0].context) > 3 * len(files[4][0].context)
    cases = [
        (["split=test"], "split: must be one of all, train, eval"),
        (["split=train", "num_docs=4"], "num_docs: sets the evaluation"),
        ([f"haystack={tmp_path / 'none.txt'}"], "haystack file not found"),
        (["num_docs=0"], "num_docs.0: Input should be greater than or equal to 1"),
        (["block_chars=0"], "block_chars must be an integer of at least 1"),
        (["--split", "eval"], "--split"),
    ]
    for args, message in cases:
        assert main(["prepare", "counting", "--out", str(tmp_path / "x"), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err

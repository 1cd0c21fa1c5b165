"""RULER-HQA: building eval_{N}.json from HotpotQA-style records, and reading it back."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.data.hotpotqa import load_hotpotqa
from memrl.data.records import Document, QARecord, render_documents
from memrl.data.ruler_hqa import (
    build_ruler_hqa,
    load_hotpotqa_pool,
    load_ruler_hqa,
    load_ruler_hqa_dir,
    render_pool_context,
    ruler_hqa_path,
    ruler_item_record,
    select_questions,
    write_ruler_hqa,
)
from memrl.errors import MemrlInputError

HEADER = re.compile(r"^Document (\d+):$", re.M)


def make_records(n: int = 4, own_extra: int = 1) -> list[QARecord]:
    """n questions, each with 2 gold paragraphs and `own_extra` own distractors."""
    records = []
    for q in range(n):
        docs = [Document(title=f"G{q}.{j}", text=f"gold {q} {j}", is_supporting=True)
                for j in range(2)]
        docs += [Document(title=f"D{q}.{j}", text=f"own distractor {q} {j}", is_supporting=False)
                 for j in range(own_extra)]
        records.append(QARecord(id=f"q{q}", question=f"Question {q}?", answers=[f"ans{q}"],
                                documents=docs))
    return records


def docs_of(context: str) -> list[tuple[str, str]]:
    """Parse a rendered context back into (title, text) pairs, checking 1-based numbering."""
    parts = HEADER.split(context)
    assert parts[0] == ""
    numbers = [int(x) for x in parts[1::2]]
    assert numbers == list(range(1, len(numbers) + 1))
    out = []
    for body in parts[2::2]:
        title, text = body.strip("\n").split("\n", 1)
        out.append((title, text))
    return out


def error_of(fn, *args, **kwargs) -> MemrlInputError:
    with pytest.raises(MemrlInputError) as info:
        fn(*args, **kwargs)
    return info.value


# --- build ----------------------------------------------------------------------------------


def test_exact_output_when_only_gold_fits():
    gold = Document(title="T", text="only gold", is_supporting=True)
    records = [
        QARecord(id="a", question="Q?", answers=["x", "y"], documents=[
            gold, Document(title="U", text="own", is_supporting=False)]),
        QARecord(id="b", question="R?", answers=["z"], documents=[
            Document(title="V", text="other", is_supporting=True)]),
    ]
    items = build_ruler_hqa(records, 1)
    assert items == [
        {"index": 0, "input": "Q?", "answers": ["x", "y"], "context": "Document 1:\nT\nonly gold",
         "num_docs": 1, "facts": ["only gold"]},
        {"index": 1, "input": "R?", "answers": ["z"], "context": "Document 1:\nV\nother",
         "num_docs": 1, "facts": ["other"]},
    ]
    # the facts (each gold paragraph's first sentence) come back with the record
    assert ruler_item_record(items[0], 0, "x").facts == ["only gold"]
    with pytest.raises(MemrlInputError, match=r"facts\[0\]"):
        ruler_item_record({**items[0], "facts": [3]}, 0, "x")
    # N=2: question a can only add V (U is its own); b adds one of a's paragraphs
    items = build_ruler_hqa(records, 2)
    assert sorted(docs_of(items[0]["context"])) == [("T", "only gold"), ("V", "other")]
    b_docs = docs_of(items[1]["context"])
    assert ("V", "other") in b_docs and len(set(b_docs) & {("T", "only gold"), ("U", "own")}) == 1


def test_gold_mode_keeps_gold_and_draws_only_other_questions_paragraphs():
    records = make_records(6)
    items = build_ruler_hqa(records, 7, seed=3)
    assert [i["index"] for i in items] == list(range(6))
    for q, item in enumerate(items):
        docs = docs_of(item["context"])
        assert len(docs) == 7 == item["num_docs"]
        assert len(set(docs)) == 7
        titles = [t for t, _ in docs]
        assert {f"G{q}.0", f"G{q}.1"} <= set(titles)
        assert f"D{q}.0" not in titles  # own distractor not used in gold mode
        assert item["input"] == f"Question {q}?" and item["answers"] == [f"ans{q}"]


def test_all_mode_keeps_own_paragraphs_first():
    records = make_records(5, own_extra=3)
    for item, q in zip(build_ruler_hqa(records, 8, include="all"), range(5)):
        titles = [t for t, _ in docs_of(item["context"])]
        assert {f"G{q}.0", f"G{q}.1", f"D{q}.0", f"D{q}.1", f"D{q}.2"} <= set(titles)
    # fewer slots than own paragraphs: gold kept, a deterministic subset of own distractors
    for item, q in zip(build_ruler_hqa(records, 3, include="all"), range(5)):
        titles = [t for t, _ in docs_of(item["context"])]
        assert {f"G{q}.0", f"G{q}.1"} <= set(titles) and len(titles) == 3
        assert all(t.startswith((f"G{q}.", f"D{q}.")) for t in titles)


def test_all_mode_without_flags_keeps_every_own_paragraph():
    records = [QARecord(id=str(q), question="Q?", answers=["a"], documents=[
        Document(title=f"P{q}.{j}", text=f"t{q}{j}") for j in range(2)]) for q in range(3)]
    err = error_of(build_ruler_hqa, records, 4)
    assert "no supporting-paragraph flags" in err.message and "include='all'" in err.message
    for q, item in enumerate(build_ruler_hqa(records, 4, include="all")):
        titles = {t for t, _ in docs_of(item["context"])}
        assert {f"P{q}.0", f"P{q}.1"} <= titles and len(titles) == 4


def test_distractor_pool_is_deduplicated_and_excludes_own_titles():
    records = make_records(3, own_extra=0)
    records.append(QARecord(id="v", question="Q?", answers=["a"], documents=[
        Document(title="G9.0", text="g", is_supporting=True),
        Document(title="G9.1", text="h", is_supporting=True),
        Document(title="G0.0", text="another version", is_supporting=False),
        Document(title="G1.0", text="gold 1 0", is_supporting=False),  # same as q1's gold
    ]))
    # 9 distinct paragraphs; q0 may not use G0.0, G0.1 nor the other version of G0.0
    err = error_of(build_ruler_hqa, records, 9)
    assert "question 'q0' needs 7 paragraphs from other questions but only 6 exist" in err.message
    items = build_ruler_hqa(records, 6)
    for item in items:
        docs = docs_of(item["context"])
        assert len(docs) == len(set(docs)) == 6
    assert ("G0.0", "another version") not in docs_of(items[0]["context"])


def test_errors():
    records = make_records(3)
    err = error_of(build_ruler_hqa, records, 1)
    assert "num_docs=1 is smaller than the 2 paragraphs question 'q0' must keep" in err.message
    # 9 paragraphs; each question keeps its 2 gold and may draw the 6 of the other questions
    assert len(build_ruler_hqa(records, 8)) == 3
    err = error_of(build_ruler_hqa, records, 9)
    assert "distractor pool too small for num_docs=9" in err.message
    assert "num_docs must be a positive integer" in error_of(build_ruler_hqa, records, 0).message
    assert "include must be one of gold, all" in error_of(
        build_ruler_hqa, records, 3, include="some").message
    assert "only 3 questions" in error_of(build_ruler_hqa, records, 3, num_questions=4).message
    assert "no paragraphs" in error_of(build_ruler_hqa, [
        QARecord(id="c", question="Q", answers=["a"], context="ready")], 3).message
    assert "no questions" in error_of(build_ruler_hqa, [], 3).message


def test_deterministic_and_independent_of_other_n(tmp_path):
    records = make_records(12, own_extra=2)
    a = write_ruler_hqa(records, tmp_path / "a", [5, 10, 20], seed=7)
    b = write_ruler_hqa(records, tmp_path / "b", [20, 5], seed=7)
    assert a == [ruler_hqa_path(tmp_path / "a", n) for n in (5, 10, 20)]
    assert [p.name for p in b] == ["eval_20.json", "eval_5.json"]
    for n in (5, 20):
        assert ruler_hqa_path(tmp_path / "a", n).read_bytes() == \
            ruler_hqa_path(tmp_path / "b", n).read_bytes()
    assert json.loads(a[1].read_text()) == build_ruler_hqa(records, 10, seed=7)
    c = write_ruler_hqa(records, tmp_path / "c", [5], seed=8)
    assert c[0].read_bytes() != a[0].read_bytes()


def test_distractors_of_smaller_n_are_a_subset_of_larger_n():
    records = make_records(20)
    small, large = build_ruler_hqa(records, 6), build_ruler_hqa(records, 15)
    for s, big in zip(small, large, strict=True):
        assert set(docs_of(s["context"])) <= set(docs_of(big["context"]))


def test_question_sample_is_deterministic_nested_and_ordered():
    records = make_records(30, own_extra=0)
    five = select_questions(records, 5, seed=1)
    assert five == select_questions(records, 5, seed=1)
    assert [r.id for r in five] == sorted((r.id for r in five), key=lambda i: int(i[1:]))
    assert set(r.id for r in five) <= set(r.id for r in select_questions(records, 12, seed=1))
    assert select_questions(records, None, seed=1) == records
    items = build_ruler_hqa(records, 4, num_questions=5, seed=1)
    assert [i["input"] for i in items] == [r.question for r in five]
    assert [i["index"] for i in items] == list(range(5))


def test_write_checks_every_n_before_writing(tmp_path):
    records = make_records(3)
    with pytest.raises(MemrlInputError, match="pool too small"):
        write_ruler_hqa(records, tmp_path / "out", [3, 50])
    assert not (tmp_path / "out").exists()


# --- load -----------------------------------------------------------------------------------


def test_write_then_load_round_trip(tmp_path):
    records = make_records(5)
    (path,) = write_ruler_hqa(records, tmp_path, [6])
    loaded = load_ruler_hqa(path)
    assert [r.id for r in loaded] == ["0", "1", "2", "3", "4"]
    for src, rec in zip(records, loaded):
        assert rec.question == src.question and rec.answers == src.answers
        assert rec.num_docs == 6 and rec.documents == []
        for gold in src.documents[:2]:
            assert render_documents([gold]).split("\n", 1)[1] in rec.context


def test_load_accepts_string_answers_missing_index_and_extra_fields(tmp_path):
    path = tmp_path / "eval_3.json"
    path.write_text(json.dumps([
        {"input": "Q1", "answers": "A", "context": "c1", "length": 100, "extra": {"x": 1}},
        {"index": 7, "input": "Q2", "answers": ["B", "", "B", "C"], "context": "c2", "num_docs": 3},
    ]))
    assert load_ruler_hqa(path) == [
        QARecord(id="0", question="Q1", answers=["A"], context="c1"),
        QARecord(id="7", question="Q2", answers=["B", "C"], context="c2", num_docs=3),
    ]
    jsonl = tmp_path / "eval_3.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in json.loads(path.read_text())) + "\n")
    assert load_ruler_hqa(jsonl) == load_ruler_hqa(path)


GOOD = {"index": 0, "input": "Q", "answers": ["a"], "context": "c", "num_docs": 1}


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({k: v for k, v in GOOD.items() if k != "input"}, "missing field 'input'"),
        ({**GOOD, "answers": 3}, "field 'answers' must be a list or a string, got an integer"),
        ({**GOOD, "answers": [""]}, "field 'answers' has no non-empty answer"),
        ({**GOOD, "answers": ["a", None]}, "field 'answers[1]' must be a string, got null"),
        ({**GOOD, "context": 3}, "field 'context' must be a string or a list, got an integer"),
        ({**GOOD, "context": ["a"]}, "field 'context[0]' must be an integer paragraph index"),
        ({**GOOD, "context": [0, True]}, "field 'context[1]' must be an integer paragraph index"),
        ({**GOOD, "num_docs": True}, "field 'num_docs' must be an integer, got a boolean"),
        ({**GOOD, "num_docs": -1}, "field 'num_docs'"),
        ({**GOOD, "index": 0.5}, "field 'index' must be a string or an integer"),
        ("text", "item must be a JSON object, got a string"),
    ],
)
def test_load_errors_name_item_and_field(tmp_path, item, expected):
    path = tmp_path / "eval_1.json"
    path.write_text(json.dumps([{**GOOD, "index": 5}, item]))
    err = error_of(load_ruler_hqa, path)
    assert err.location == f"{path} item 1" and expected in err.message


def test_load_file_level_errors(tmp_path):
    path = tmp_path / "eval_1.json"
    for text, expected in [("", "file is empty"), ("[]", "empty list"),
                           ("{}", "expected a JSON list"), ("[1,", "invalid JSON")]:
        path.write_text(text)
        assert expected in error_of(load_ruler_hqa, path).message
    path.write_text(json.dumps([GOOD, GOOD]))
    assert "duplicate question id '0'" in error_of(load_ruler_hqa, path).message


def test_load_dir_lists_every_missing_file(tmp_path):
    write_ruler_hqa(make_records(6), tmp_path, [3, 10])
    (tmp_path / "eval_x.json").write_text("[]")
    loaded = load_ruler_hqa_dir(tmp_path, [10, 3])
    assert list(loaded) == [10, 3] and all(len(v) == 6 for v in loaded.values())
    err = error_of(load_ruler_hqa_dir, tmp_path, [3, 5, 50])
    assert err.location == str(tmp_path)
    assert "missing eval_5.json, eval_50.json (present: eval_3.json, eval_10.json)" in err.message
    assert "not found" in error_of(load_ruler_hqa_dir, tmp_path / "nope", [3]).message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(
    st.sampled_from(["index", "input", "answers", "context", "num_docs", "other"]),
    st.none() | st.booleans() | st.integers() | st.text(max_size=5)
    | st.lists(st.text(max_size=3) | st.integers(), max_size=3),
    max_size=6,
), max_size=4))
def test_random_items_only_ever_raise_input_errors(items):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "eval_1.json"
        path.write_text(json.dumps(items))
        try:
            records = load_ruler_hqa(path)
        except MemrlInputError:
            return
        assert len(records) == len(items)


# --- index-list files (MemAgent's eval_12800 / eval_25600) -------------------------------

# A tiny file in the official HotpotQA dev format: [title, [sentences]] pairs per question.
# The pool is the distinct `title\n''.join(sentences)` strings SORTED (MemAgent's
# read_hotpotqa), which here differs from the order of first appearance (Zeta, Alpha, ...).
DEV = [
    {"_id": "a", "question": "Q1?", "answer": "x", "type": "bridge", "level": "easy",
     "supporting_facts": [["Zeta", 0]],
     "context": [["Zeta", ["Z one. ", "Z two."]], ["Alpha", ["A one."]]]},
    {"_id": "b", "question": "Q2?", "answer": "y", "type": "bridge", "level": "easy",
     "supporting_facts": [["Mid", 0]],
     "context": [["Alpha", ["A one."]], ["Mid", ["M", "."]], ["alpha", ["lower."]]]},
]
POOL = ["Alpha\nA one.", "Mid\nM.", "Zeta\nZ one. Z two.", "alpha\nlower."]


@pytest.fixture
def dev_pool(tmp_path) -> Path:
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(DEV))
    return path


def write_items(path: Path, items: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items))
    return path


INDEX_ITEMS = [
    {"index": 0, "input": "Q1?", "answers": ["x"], "context": [2, 0, 3], "num_docs": 3},
    {"index": 1, "input": "Q2?", "answers": ["y"], "context": [1, 3, 0], "num_docs": 3},
]


def test_pool_is_sorted_distinct_title_newline_sentences(dev_pool):
    assert load_hotpotqa_pool(dev_pool) == POOL


def test_index_list_file_renders_the_same_context_as_the_string_file(tmp_path, dev_pool):
    index_file = write_items(tmp_path / "idx" / "eval_3.json", INDEX_ITEMS)
    strings = [
        "Document 1:\nZeta\nZ one. Z two.\n\nDocument 2:\nAlpha\nA one.\n\n"
        "Document 3:\nalpha\nlower.",
        "Document 1:\nMid\nM.\n\nDocument 2:\nalpha\nlower.\n\nDocument 3:\nAlpha\nA one.",
    ]
    string_file = write_items(tmp_path / "str" / "eval_3.json",
                              [{**item, "context": s} for item, s in zip(INDEX_ITEMS, strings)])
    from_indices = load_ruler_hqa(index_file, pool=dev_pool)
    assert from_indices == load_ruler_hqa(string_file)
    assert from_indices[0].context == render_documents([
        Document(title="Zeta", text="Z one. Z two."), Document(title="Alpha", text="A one."),
        Document(title="alpha", text="lower.")])
    # a pool read once can be passed as a list; string files ignore the pool
    assert load_ruler_hqa(index_file, pool=POOL) == from_indices
    assert load_ruler_hqa(string_file, pool=tmp_path / "no-such-pool.json") == \
        load_ruler_hqa(string_file)
    assert render_pool_context([], POOL) == ""
    # the directory loader shares the pool between files
    write_items(tmp_path / "idx" / "eval_2.json", [{**INDEX_ITEMS[0], "context": [0, 1],
                                                     "num_docs": 2}])
    loaded = load_ruler_hqa_dir(tmp_path / "idx", [3, 2], pool=dev_pool)
    assert loaded[3] == from_indices and loaded[2][0].num_docs == 2


def test_index_list_file_without_pool_is_a_one_line_error(tmp_path):
    path = write_items(tmp_path / "eval_3.json", INDEX_ITEMS)
    err = error_of(load_ruler_hqa, path)
    assert err.location == f"{path} item 0"
    assert "list of paragraph indices" in err.message and "pool=" in err.message
    assert "\n" not in str(err)
    err = error_of(load_ruler_hqa_dir, tmp_path, [3])
    assert err.location == f"{path} item 0" and "pool=" in err.message


@pytest.mark.parametrize(("bad", "position"), [(4, 1), (-1, 1), (10**9, 2)])
def test_out_of_range_index_names_file_item_and_index(tmp_path, dev_pool, bad, position):
    context = [0, bad, 1] if position == 1 else [0, 1, bad]
    path = write_items(tmp_path / "eval_3.json",
                       [INDEX_ITEMS[0], {**INDEX_ITEMS[1], "context": context}])
    err = error_of(load_ruler_hqa, path, pool=dev_pool)
    assert err.location == f"{path} item 1"
    assert err.message == (f"context[{position}] = {bad} is out of range for the pool of 4 "
                           f"paragraphs ({dev_pool})")
    assert "\n" not in str(err)


def test_pool_file_errors(tmp_path):
    path = tmp_path / "dev.json"
    for data, expected in [
        ({"data": []}, "expected the HotpotQA dev JSON (a list of questions), got an object"),
        ([], "holds no paragraphs"),
        ([{"question": "Q"}], "missing field 'context'"),
        ([{"context": [["T", "not a list"]]}], "field 'context[0]' must be a [title, "),
        ([{"context": [["T", ["s"], "extra"]]}], "field 'context[0]' must be a [title, "),
    ]:
        path.write_text(json.dumps(data))
        assert expected in error_of(load_hotpotqa_pool, path).message
    items = write_items(tmp_path / "eval_3.json", INDEX_ITEMS)
    err = error_of(load_ruler_hqa, items, pool=tmp_path / "missing.json")
    assert err.message == "file not found" and err.location == str(tmp_path / "missing.json")


def test_num_docs_must_match_n_unless_the_file_is_given_alone(tmp_path, dev_pool):
    path = write_items(tmp_path / "eval_3.json", [{**GOOD, "num_docs": 4}])
    err = error_of(load_ruler_hqa_dir, tmp_path, [3])
    assert err.location == f"{path} item 0"
    assert err.message.startswith("num_docs is 4 but the file was loaded as N=3")
    assert load_ruler_hqa(path)[0].num_docs == 4  # given explicitly: loaded as it is
    # records that disagree with each other
    write_items(path, [{**GOOD, "num_docs": 3}, {**GOOD, "index": 1, "num_docs": 5}])
    assert error_of(load_ruler_hqa, path, expected_num_docs=3).location == f"{path} item 1"
    assert [r.num_docs for r in load_ruler_hqa(path)] == [3, 5]
    # no num_docs field: an index list counts its indices, a string is not checked
    write_items(path, [{k: v for k, v in INDEX_ITEMS[0].items() if k != "num_docs"},
                       {k: v for k, v in GOOD.items() if k != "num_docs"} | {"index": 1}])
    records = load_ruler_hqa(path, pool=dev_pool, expected_num_docs=3)
    assert [r.num_docs for r in records] == [3, None]
    assert "loaded as N=2" in error_of(load_ruler_hqa, path, pool=dev_pool,
                                       expected_num_docs=2).message


# --- real data ------------------------------------------------------------------------------


def test_real_dev_sample_keeps_gold_paragraphs(shared_data):
    records = load_hotpotqa(shared_data / "hotpotqa" / "dev_subsampled.jsonl")
    items = build_ruler_hqa(records, 30, num_questions=25, seed=0)
    by_question = {r.question: r for r in records}
    for item in items:
        source = by_question[item["input"]]
        assert len(HEADER.findall(item["context"])) == 30
        for gold in (d for d in source.documents if d.is_supporting):
            assert f"\n{gold.title}\n{gold.text}" in item["context"]

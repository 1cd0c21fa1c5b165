"""HotpotQA loaders: official JSON, IRCoT JSONL, memrl JSONL, MemAgent parquet, hf: sources."""

from __future__ import annotations

import json
import socket
import sys
import tempfile
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memrl.data.hotpotqa import (
    load_hf_hotpotqa,
    load_hotpotqa,
    load_memagent_parquet,
    parse_hf_spec,
    save_memagent_parquet,
    save_records,
    save_records_jsonl,
    sniff_jsonl_format,
)
from memrl.data.records import Document, QARecord
from memrl.errors import MemrlInputError, MissingDependencyError

OFFICIAL = [
    {
        "_id": "q1",
        "question": "Which city hosts T1?",
        "answer": "Paris",
        "context": [["T1", ["Alpha is big.", " It is in Paris."]], ["T2", ["Beta."]]],
        "supporting_facts": [["T1", 0], ["T1", 1]],
        "type": "bridge",
        "level": "easy",
    },
    {
        "_id": "q2",
        "question": "Who wrote T3?",
        "answer": "Ann",
        "context": [["T3", ["Gamma ", "by Ann."]], ["T4", []]],
        "supporting_facts": [["T3", 1], ["T4", 0]],
        "type": "comparison",
        "level": "hard",
    },
]


def ircot_line(qid="a1", question="Q?", spans=(("x",),), contexts=None) -> dict:
    return {
        "question_id": qid,
        "question_text": question,
        "answers_objects": [
            {"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": list(s)}
            for s in spans
        ],
        "contexts": contexts if contexts is not None else [
            {"id": "0", "title": "A", "paragraph_text": "Text A.", "is_supporting": True},
            {"id": "1", "title": "B", "paragraph_text": "Text B.", "is_supporting": False},
        ],
    }


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value))
    return path


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def error_of(fn, *args, **kwargs) -> MemrlInputError:
    with pytest.raises(MemrlInputError) as info:
        fn(*args, **kwargs)
    return info.value


# --- official -------------------------------------------------------------------------------


def test_official_exact_records(tmp_path):
    path = write_json(tmp_path / "dev.json", OFFICIAL)
    records = load_hotpotqa(path)
    assert records == [
        QARecord(id="q1", question="Which city hosts T1?", answers=["Paris"], documents=[
            Document(title="T1", text="Alpha is big. It is in Paris.", is_supporting=True),
            Document(title="T2", text="Beta.", is_supporting=False),
        ]),
        QARecord(id="q2", question="Who wrote T3?", answers=["Ann"], documents=[
            Document(title="T3", text="Gamma by Ann.", is_supporting=True),
            Document(title="T4", text="", is_supporting=True),
        ]),
    ]
    assert load_hotpotqa(path, format="official") == records


def test_official_without_supporting_facts_has_unknown_flags(tmp_path):
    item = {k: v for k, v in OFFICIAL[0].items() if k != "supporting_facts"}
    (record,) = load_hotpotqa(write_json(tmp_path / "x.json", [item]))
    assert [d.is_supporting for d in record.documents] == [None, None]


def test_official_test_set_without_answer_is_explained(tmp_path):
    item = {k: v for k, v in OFFICIAL[1].items() if k != "answer"}
    path = write_json(tmp_path / "test.json", [OFFICIAL[0], item])
    err = error_of(load_hotpotqa, path)
    assert err.location == f"{path} item 1"
    assert "answer" in err.message and "test set" in err.message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"question": 3}, "field 'question' must be a string, got an integer"),
        ({"answer": "  "}, "field 'answer' is empty"),
        ({"context": "T1"}, "field 'context' must be a list, got a string"),
        ({"context": [["T1", "not a list"]]}, "field 'context[0][1]' must be a list"),
        ({"context": [["T1", ["ok", 5]]]}, "field 'context[0][1][1]' must be a string"),
        ({"supporting_facts": [["T1", "0"]]}, "supporting_facts[0]"),
        ({"_id": None}, "field '_id' must be a string or an integer, got null"),
    ],
)
def test_official_field_errors_name_item_and_field(tmp_path, change, expected):
    path = write_json(tmp_path / "bad.json", [OFFICIAL[0], {**OFFICIAL[1], **change}])
    err = error_of(load_hotpotqa, path)
    assert err.location == f"{path} item 1"
    assert expected in err.message


def test_official_missing_context(tmp_path):
    item = {k: v for k, v in OFFICIAL[0].items() if k != "context"}
    err = error_of(load_hotpotqa, write_json(tmp_path / "x.json", [item]))
    assert err.message == "missing field 'context'"


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("", "file is empty", None),
        ("  \n", "file is empty", None),
        ("[]", "file has no questions (empty list)", None),
        ('{"a": 1}', "expected a JSON list of HotpotQA questions, got an object", None),
        ('[\n{"_id": "q1",\n oops}]', "invalid JSON", 3),
    ],
)
def test_official_file_level_errors(tmp_path, text, message, line):
    path = tmp_path / "f.json"
    path.write_text(text)
    err = error_of(load_hotpotqa, path)
    assert message in err.message
    assert err.location == (f"{path}:{line}" if line else str(path))


def test_missing_file_and_unknown_suffix(tmp_path):
    assert error_of(load_hotpotqa, tmp_path / "nope.json").message == "file not found"
    path = tmp_path / "data.txt"
    path.write_text("[]")
    assert "suffix '.txt'" in error_of(load_hotpotqa, path).message
    assert "unknown format" in error_of(load_hotpotqa, path, format="csv").message


def test_ruler_file_given_to_hotpotqa_loader_points_to_load_ruler_hqa(tmp_path):
    path = write_json(tmp_path / "eval_10.json",
                      [{"index": 0, "input": "Q", "answers": ["a"], "context": "c"}])
    assert "load_ruler_hqa" in error_of(load_hotpotqa, path).message


def test_duplicate_ids_are_rejected(tmp_path):
    path = write_json(tmp_path / "d.json", [OFFICIAL[0], OFFICIAL[0]])
    err = error_of(load_hotpotqa, path)
    assert err.location == f"{path} item 1"
    assert f"duplicate question id 'q1' (first seen at {path} item 0)" == err.message


# --- IRCoT ----------------------------------------------------------------------------------


def test_ircot_answers_are_all_spans_deduplicated_in_order(tmp_path):
    path = write_lines(tmp_path / "dev.jsonl", [
        ircot_line("a1", spans=[("x", "y"), ("y", "z", " ")]),
        "",
        ircot_line(7, question="Second?"),
    ])
    assert sniff_jsonl_format(path) == "ircot"
    first, second = load_hotpotqa(path)
    assert first == QARecord(id="a1", question="Q?", answers=["x", "y", "z"], documents=[
        Document(title="A", text="Text A.", is_supporting=True),
        Document(title="B", text="Text B.", is_supporting=False),
    ])
    assert second.id == "7" and second.question == "Second?"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "record must be a JSON object, got a list"),
        ({k: v for k, v in ircot_line().items() if k != "question_text"},
         "missing field 'question_text'"),
        ({**ircot_line(), "answers_objects": {}}, "field 'answers_objects' must be a list"),
        (ircot_line(spans=[("",)]), "field 'answers_objects[].spans' has no non-empty answer"),
        (ircot_line(spans=[]), "has no non-empty answer"),
        ({**ircot_line(), "answers_objects": [{"spans": [1]}]},
         "field 'answers_objects[0].spans[0]' must be a string"),
        (ircot_line(contexts=[{"title": "A", "is_supporting": True}]),
         "missing field 'contexts[0].paragraph_text'"),
        (ircot_line(contexts=[{"title": "A", "paragraph_text": "t", "is_supporting": "yes"}]),
         "field 'contexts[0].is_supporting' must be a boolean, got a string"),
        (ircot_line(contexts=["A"]), "'contexts[0]' must be a JSON object"),
    ],
)
def test_ircot_errors_name_line_and_field(tmp_path, line, expected):
    path = write_lines(tmp_path / "bad.jsonl", [ircot_line("ok"), "   ", line])
    err = error_of(load_hotpotqa, path, format="ircot")
    assert err.location == f"{path}:3"
    assert expected in err.message


def test_jsonl_lines_split_only_at_newlines(tmp_path):
    path = tmp_path / "u.jsonl"
    line = json.dumps(ircot_line(question="a\u2028b\x0cc?"), ensure_ascii=False)
    path.write_text(line + "\r\n" + line.replace('"a1"', '"a2"') + "\r\n", encoding="utf-8")
    records = load_hotpotqa(path)
    assert [r.question for r in records] == ["a\u2028b\x0cc?"] * 2
    path.write_text(line + "\n\u2028{", encoding="utf-8")
    assert error_of(load_hotpotqa, path).location == f"{path}:2"


def test_jsonl_empty_and_unknown_and_non_utf8(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    assert error_of(load_hotpotqa, empty).message == "file is empty"
    odd = write_lines(tmp_path / "o.jsonl", ["", {"foo": 1}])
    err = error_of(load_hotpotqa, odd)
    assert err.location == f"{odd}:2" and "cannot tell the JSONL format" in err.message
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b'{"question": "a"}\n\xff\xfe\n')
    err = error_of(load_hotpotqa, binary)
    assert err.location == f"{binary}:2" and "UTF-8" in err.message


# --- memrl JSONL ----------------------------------------------------------------------------


def test_memrl_jsonl_round_trip(tmp_path):
    records = load_hotpotqa(write_json(tmp_path / "dev.json", OFFICIAL))
    records.append(QARecord(id="c", question="Q?", answers=["a", "b"], context="Document 1:\nT\nx",
                            num_docs=1))
    out = save_records_jsonl(records, tmp_path / "sub" / "out.jsonl")
    assert sniff_jsonl_format(out) == "memrl"
    assert load_hotpotqa(out) == records
    assert load_hotpotqa(out, format="memrl") == records
    assert not [p for p in out.parent.iterdir() if p.name != "out.jsonl"]  # no temp files left
    save_records_jsonl(records, out)  # overwriting is fine
    assert load_hotpotqa(out) == records


def test_memrl_jsonl_errors(tmp_path):
    good = QARecord(id="a", question="Q", answers=["x"]).model_dump()
    path = write_lines(tmp_path / "m.jsonl", [good, {**good, "id": "b", "extra": 1}])
    err = error_of(load_hotpotqa, path)
    assert err.location == f"{path}:2" and "field 'extra'" in err.message
    path = write_lines(tmp_path / "m2.jsonl", [{**good, "answers": [""]}])
    assert "at least one gold answer must be non-empty" in error_of(load_hotpotqa, path).message
    path = write_lines(tmp_path / "m3.jsonl", [{**good, "answers": "x"}])
    assert "field 'answers'" in error_of(load_hotpotqa, path).message


def test_save_records_rejects_unknown_suffix(tmp_path):
    record = QARecord(id="a", question="Q", answers=["x"])
    err = error_of(save_records, [record], tmp_path / "x.csv")
    assert "must end in .jsonl or .parquet" in err.message


# --- MemAgent parquet -----------------------------------------------------------------------


def test_parquet_round_trip_keeps_ids_answers_and_context(tmp_path):
    records = load_hotpotqa(write_json(tmp_path / "dev.json", OFFICIAL))
    path = save_memagent_parquet(records, tmp_path / "train.parquet")
    back = load_hotpotqa(path)
    assert [(r.id, r.question, r.answers, r.num_docs) for r in back] == [
        ("q1", "Which city hosts T1?", ["Paris"], 2), ("q2", "Who wrote T3?", ["Ann"], 2)
    ]
    assert [r.context for r in back] == [r.render_context() for r in records]
    # and once more through memrl JSONL and parquet: nothing changes
    save_records(back, tmp_path / "again.jsonl")
    assert load_hotpotqa(tmp_path / "again.jsonl") == back
    assert load_hotpotqa(save_records(back, tmp_path / "again.parquet")) == back


def _memagent_table(rows: list[dict]):
    import pyarrow as pa

    return pa.Table.from_pylist(rows)


def test_parquet_in_memagent_layout(tmp_path):
    import pyarrow.parquet as pq

    rows = [
        {"data_source": "hotpotqa",
         "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q1?"}],
         "context": "ctx one", "reward_model": {"style": "rule", "ground_truth": "Yes"},
         "extra_info": {"index": 11}},
        {"data_source": "hotpotqa",
         "prompt": [{"role": "user", "content": "Q2?"}, {"role": "assistant", "content": "hm"}],
         "context": "ctx two", "reward_model": {"style": "rule", "ground_truth": "No"},
         "extra_info": {"index": 12}},
    ]
    path = tmp_path / "memagent.parquet"
    pq.write_table(_memagent_table(rows), path)
    assert load_memagent_parquet(path) == [
        QARecord(id="11", question="Q1?", answers=["Yes"], context="ctx one"),
        QARecord(id="12", question="Q2?", answers=["No"], context="ctx two"),
    ]
    # no extra_info: ids are row numbers; ground truth as list
    rows = [{"prompt": [{"role": "user", "content": "Q?"}], "context": "c",
             "reward_model": {"ground_truth": ["a", "b", "a"]}}]
    pq.write_table(_memagent_table(rows), path)
    assert load_memagent_parquet(path) == [QARecord(id="0", question="Q?", answers=["a", "b"],
                                                    context="c")]


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"prompt": [{"role": "system", "content": "s"}], "context": "c",
          "reward_model": {"ground_truth": "a"}}, "no message with role 'user'"),
        ({"prompt": [{"role": "user", "content": "q"}], "context": "c",
          "reward_model": {"ground_truth": ""}}, "reward_model.ground_truth"),
        ({"prompt": [{"role": "user", "content": "q"}], "context": "c",
          "reward_model": {"style": "rule"}}, "missing field 'reward_model.ground_truth'"),
    ],
)
def test_parquet_row_errors(tmp_path, row, expected):
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(_memagent_table([row]), path)
    err = error_of(load_hotpotqa, path)
    assert err.location == f"{path} row 0" and expected in err.message


def test_parquet_file_errors(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "cols.parquet"
    pq.write_table(_memagent_table([{"prompt": "q", "answer": "a"}]), path)
    assert "missing column(s) context, reward_model" in error_of(load_hotpotqa, path).message
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    assert "not a readable parquet file" in error_of(load_hotpotqa, junk).message


# --- Hugging Face ---------------------------------------------------------------------------


def test_parse_hf_spec():
    assert parse_hf_spec("hf:hotpot_qa") == ("hotpot_qa", "distractor", "validation")
    assert parse_hf_spec("hf:hotpotqa/hotpot_qa:train") == (
        "hotpotqa/hotpot_qa", "distractor", "train")
    assert parse_hf_spec("hf:org/data:fullwiki:test") == ("org/data", "fullwiki", "test")
    for bad in ("hf:", "hf:a::b", "hf:a:b:c:d"):
        assert "bad Hugging Face dataset" in error_of(parse_hf_spec, bad).message


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("tests must not open network connections")

    monkeypatch.setattr(socket, "create_connection", refuse)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


def fake_datasets(monkeypatch, load_dataset) -> None:
    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_hf_without_datasets_package(monkeypatch, no_network):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(MissingDependencyError, match=r"memrl\[datasets\]"):
        load_hotpotqa("hf:hotpot_qa:validation")


def test_hf_offline_not_cached_fails_clearly_without_network(monkeypatch, no_network):
    def load_dataset(name, config, split):
        raise FileNotFoundError(f"Couldn't find cache for {name}")

    fake_datasets(monkeypatch, load_dataset)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = error_of(load_hotpotqa, "hf:hotpot_qa:validation")
    assert "not in the local cache" in err.message and "offline" in err.message
    assert "hotpot_qa (distractor) split validation" in err.message


def test_hf_offline_cached_rows_are_mapped(monkeypatch, no_network):
    rows = [{
        "id": "h1", "question": "Q?", "answer": "A", "type": "bridge", "level": "easy",
        "supporting_facts": {"title": ["T2"], "sent_id": [0]},
        "context": {"title": ["T1", "T2"], "sentences": [["a", "b"], ["c"]]},
    }]
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return rows

    fake_datasets(monkeypatch, load_dataset)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "true")
    assert load_hf_hotpotqa("hf:hotpot_qa:train") == [
        QARecord(id="h1", question="Q?", answers=["A"], documents=[
            Document(title="T1", text="ab", is_supporting=False),
            Document(title="T2", text="c", is_supporting=True),
        ])
    ]
    assert calls == [("hotpot_qa", "distractor", "train")]


def test_hf_online_unreachable_hub_fails_fast(monkeypatch, no_network):
    fake_datasets(monkeypatch, lambda *a, **k: pytest.fail("must not load when the hub is down"))
    seen = {}

    def unreachable(address, timeout):
        seen["timeout"] = timeout
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    err = error_of(load_hotpotqa, "hf:hotpot_qa")
    assert "cannot reach the Hugging Face Hub" in err.message and "HF_HUB_OFFLINE=1" in err.message
    assert seen["timeout"] == 3.0


def test_hf_prefix_with_other_format_is_an_error():
    assert "format must be auto or hf" in error_of(load_hotpotqa, "hf:x", format="ircot").message
    assert "hf:NAME" in error_of(load_hotpotqa, "x.json", format="hf").message


# --- properties -----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(
        st.sampled_from(["question", "question_text", "question_id", "id", "answers",
                         "answers_objects", "spans", "contexts", "title", "paragraph_text",
                         "is_supporting", "documents", "text", "x"]),
        inner, max_size=5),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode()),
                max_size=4),
       st.sampled_from(["auto", "ircot", "memrl"]))
def test_random_jsonl_only_ever_raises_input_errors(lines, format):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "random.jsonl"
        path.write_bytes(b"\n".join(lines))
        try:
            records = load_hotpotqa(path, format=format)
        except MemrlInputError:
            return
        assert all(isinstance(r, QARecord) for r in records)


@settings(max_examples=40, deadline=None)
@given(json_values)
def test_random_official_json_only_ever_raises_input_errors(value):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "random.json"
        path.write_text(json.dumps([value]))
        try:
            load_hotpotqa(path)
        except MemrlInputError:
            pass


# --- real data ------------------------------------------------------------------------------


def test_ircot_dev_file_loads_500_records(shared_data):
    records = load_hotpotqa(shared_data / "hotpotqa" / "dev_subsampled.jsonl")
    assert len(records) == 500
    assert len({r.id for r in records}) == 500
    assert records[0].id == "5a8c7595554299585d9e36b6"
    assert records[0].answers == ["Chief of Protocol"]
    assert all(sum(bool(d.is_supporting) for d in r.documents) == 2 for r in records)

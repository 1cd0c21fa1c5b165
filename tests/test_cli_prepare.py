"""`memrl prepare hotpotqa | ruler-hqa | synthetic` through memrl.cli.main (exit codes, output)."""

from __future__ import annotations

import json
import re

import pytest

from memrl.cli import main
from memrl.data.hotpotqa import load_hotpotqa
from memrl.data.ruler_hqa import load_ruler_hqa_dir
from memrl.data.synthetic import make_synthetic_records

OFFICIAL_ITEM = {
    "_id": "q1", "question": "Q?", "answer": "A",
    "context": [["T1", ["a", "b"]], ["T2", ["c"]]],
    "supporting_facts": [["T1", 0]], "type": "bridge", "level": "easy",
}
IRCOT_LINE = {
    "question_id": "i1", "question_text": "Q?",
    "answers_objects": [{"spans": ["A"]}],
    "contexts": [{"id": "0", "title": "T", "paragraph_text": "p", "is_supporting": True}],
}


def one_line_error(capsys, expected_location: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected_location in lines[0]
    return lines[0]


def test_synthetic_writes_loadable_jsonl(tmp_path, capsys):
    out = tmp_path / "syn.jsonl"
    args = ["prepare", "synthetic", "--out", str(out), "num_questions=6", "num_docs=5", "seed=3"]
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().out
    assert load_hotpotqa(out) == make_synthetic_records(6, num_docs=5, seed=3)
    first = out.read_bytes()
    assert main(args) == 0 and out.read_bytes() == first


def test_synthetic_bad_arguments(tmp_path, capsys):
    assert main(["prepare", "synthetic", "--out", str(tmp_path / "s.jsonl"),
                 "num_docs=1"]) == 2
    one_line_error(capsys, "num_docs must be an integer of at least 2")
    assert main(["prepare", "synthetic", "--out", str(tmp_path / "s.jsonl"),
                 "num_docs=[3,4]"]) == 2
    one_line_error(capsys, "num_docs: Input should be a valid integer")
    assert main(["prepare", "synthetic", "--out", str(tmp_path / "s.jsonl"), "seeds=1"]) == 2
    one_line_error(capsys, "seeds: unknown key")
    assert main(["prepare", "synthetic", "--out", str(tmp_path / "s.txt")]) == 2
    one_line_error(capsys, "must end in .jsonl or .parquet")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_hotpotqa_official_to_jsonl_and_parquet(tmp_path, capsys, suffix):
    src = tmp_path / "dev.json"
    src.write_text(json.dumps([OFFICIAL_ITEM]))
    out = tmp_path / f"out{suffix}"
    assert main(["prepare", "hotpotqa", "--input", str(src), "--output", str(out)]) == 0
    assert "1 questions" in capsys.readouterr().out
    (record,) = load_hotpotqa(out)
    assert (record.id, record.question, record.answers) == ("q1", "Q?", ["A"])
    assert record.render_context() == "Document 1:\nT1\nab\n\nDocument 2:\nT2\nc"


def test_hotpotqa_explicit_format(tmp_path):
    src = tmp_path / "dev.data"
    src.write_text(json.dumps(IRCOT_LINE) + "\n")
    out = tmp_path / "o.jsonl"
    assert main(["prepare", "hotpotqa", "-i", str(src), "-o", str(out), "format=ircot"]) == 0
    assert load_hotpotqa(out)[0].id == "i1"


@pytest.mark.parametrize(
    ("content", "location", "message"),
    [
        # missing field
        ([IRCOT_LINE, {k: v for k, v in IRCOT_LINE.items() if k != "question_text"}],
         ":2", "missing field 'question_text'"),
        # wrong type
        ([IRCOT_LINE, {**IRCOT_LINE, "contexts": "none"}], ":2",
         "field 'contexts' must be a list, got a string"),
        # non-JSON line
        ([IRCOT_LINE, "", "{oops"], ":3", "invalid JSON"),
        # empty answer
        ([{**IRCOT_LINE, "answers_objects": [{"spans": [""]}]}], ":1", "no non-empty answer"),
    ],
)
def test_hotpotqa_bad_lines_exit_2_with_location(tmp_path, capsys, content, location, message):
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in content) + "\n")
    assert main(["prepare", "hotpotqa", "--input", str(src), "--output",
                 str(tmp_path / "o.jsonl")]) == 2
    line = one_line_error(capsys, f"{src}{location}: ")
    assert message in line
    assert not (tmp_path / "o.jsonl").exists()


def test_hotpotqa_empty_file_and_bad_options(tmp_path, capsys):
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    assert main(["prepare", "hotpotqa", "--input", str(src),
                 "--output", str(tmp_path / "o.jsonl")]) == 2
    assert one_line_error(capsys, str(src)).endswith("file is empty")
    assert main(["prepare", "hotpotqa", "--input", str(src), "--output", str(tmp_path / "o.jsonl"),
                 "format=xml"]) == 2
    one_line_error(capsys, "format: must be one of auto, official")
    assert main(["prepare", "hotpotqa", "--input", str(tmp_path / "missing.json"),
                 "--output", str(tmp_path / "o.jsonl")]) == 2
    one_line_error(capsys, "missing.json: file not found")
    assert main(["prepare", "hotpotqa", "--input", str(src)]) == 2  # usage error from typer
    assert "Traceback" not in capsys.readouterr().err


def test_ruler_hqa_from_synthetic(tmp_path, capsys):
    src = tmp_path / "syn.jsonl"
    assert main(["prepare", "synthetic", "--out", str(src), "num_questions=10",
                 "num_docs=4"]) == 0
    out = tmp_path / "rh"
    assert main(["prepare", "ruler-hqa", "--input", str(src), "num_docs=[3,12]",
                 "num_questions=5", "seed=1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "eval_3.json" in printed and "eval_12.json" in printed
    loaded = load_ruler_hqa_dir(out, [3, 12])
    assert [len(v) for v in loaded.values()] == [5, 5]
    assert main(["prepare", "ruler-hqa", "--input", str(src), "num_docs=1",
                 "--out", str(out)]) == 2
    one_line_error(capsys, "num_docs=1 is smaller than the 2 paragraphs")
    assert main(["prepare", "ruler-hqa", "--input", str(src), "num_docs=5",
                 "include=most", "--out", str(out)]) == 2
    one_line_error(capsys, "include: must be one of gold, all")
    assert main(["prepare", "ruler-hqa", "--input", str(src), "--out", str(out)]) == 2
    one_line_error(capsys, "num_docs: Field required")


def test_ruler_hqa_on_the_real_dev_file(shared_data, tmp_path, capsys):
    src = shared_data / "hotpotqa" / "dev_subsampled.jsonl"
    out = tmp_path / "ruler"
    assert main(["prepare", "ruler-hqa", "--input", str(src), "num_docs=[10,50,200]",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    sources = load_hotpotqa(src)
    header = re.compile(r"^Document \d+:$", re.M)
    for n, records in load_ruler_hqa_dir(out, [10, 50, 200]).items():
        assert len(records) == len(sources) == 500
        for record, source in zip(records, sources):
            assert record.num_docs == n and record.question == source.question
            assert record.answers == source.answers
            assert len(header.findall(record.context)) == n
            for gold in (d for d in source.documents if d.is_supporting):
                assert f":\n{gold.title}\n{gold.text}" in record.context


def files_of(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_the_commands_write_what_the_library_writes(tmp_path, capsys):
    """`memrl prepare where-now / ruler-hqa / biographies` with keys write the same bytes as
    the generators called directly with the same settings (issue 45's grammar changed the
    command line only)."""
    from memrl.data.biographies import write_biographies
    from memrl.data.ruler_hqa import write_ruler_hqa
    from memrl.data.state_tracking import StateFiles, write_state_tracking

    cli, lib = tmp_path / "cli", tmp_path / "lib"
    assert main(["prepare", "where-now", "--out", str(cli / "wn"), "train_questions=12",
                 "val_questions=3", "eval_questions=5", "num_docs=[2,4]", "seed=1",
                 "block_chars=300"]) == 0
    write_state_tracking("where-now", lib / "wn", StateFiles(
        seed=1, train_questions=12, val_questions=3, eval_questions=5, eval_docs=(2, 4),
        block_chars=300))
    assert main(["prepare", "biographies", "--out", str(cli / "bio"), "split=eval",
                 "eval_questions=6", "num_docs=[8,16]", "seed=2", "names=shared"]) == 0
    write_biographies(lib / "bio", split="eval", eval_questions=6, eval_docs=[8, 16], seed=2,
                      names="shared")
    src = tmp_path / "syn.jsonl"
    assert main(["prepare", "synthetic", "--out", str(src), "num_questions=10",
                 "num_docs=4"]) == 0
    assert main(["prepare", "ruler-hqa", "--input", str(src), "--out", str(cli / "rh"),
                 "num_docs=[3,12]", "num_questions=5", "seed=7", "include=all"]) == 0
    write_ruler_hqa(load_hotpotqa(src), lib / "rh", [3, 12], 7, num_questions=5, include="all")
    capsys.readouterr()
    for name in ("wn", "bio", "rh"):
        written = files_of(cli / name)
        assert written and written == files_of(lib / name), name


def test_a_config_file_holds_the_keys(tmp_path, capsys):
    """`memrl prepare NAME --out DIR CONFIG.yaml [key=value ...]`: the file, then the keys."""
    config = tmp_path / "syn.yaml"
    config.write_text("num_questions: 3\nnum_docs: 4\nseed: 5\n")
    out = tmp_path / "syn.jsonl"
    assert main(["prepare", "synthetic", "--out", str(out), str(config), "seed=6"]) == 0
    assert load_hotpotqa(out) == make_synthetic_records(3, num_docs=4, seed=6)
    config.write_text("num_question: 3\n")
    assert main(["prepare", "synthetic", "--out", str(tmp_path / "b.jsonl"), str(config)]) == 2
    one_line_error(capsys, "num_question: unknown key")

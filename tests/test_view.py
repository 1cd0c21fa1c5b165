"""`memrl view`: word diffs and gold tracking by hand, escaping under hypothesis, and the page
in a real headless browser (Chromium; skipped with a reason where none is installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.apps.view import gold_events, holds_gold, render_page, word_diff, write_view
from memrl.cli import main as cli_main


def test_word_diff_by_hand():
    assert word_diff("a b c", "a c d") == [
        ("same", "a "), ("dropped", "b "), ("same", "c "), ("added", "d"),
    ]
    assert word_diff("", "x") == [("added", "x")]


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_word_diff_rebuilds_both_texts(before, after):
    pieces = word_diff(before, after)
    assert "".join(t for op, t in pieces if op != "dropped") == after
    assert "".join(t for op, t in pieces if op != "added").split() == before.split()


def test_gold_enters_and_leaves_memory():
    memories = ["No previous memory", "Kovan was born in Zarnia.", "Zarnia!", "nothing"]
    assert gold_events(memories, ["Zarnia"]) == ["", "enters", "kept", "leaves"]
    assert not holds_gold("Zarniak", ["Zarnia"])  # whole words only


def test_the_chunk_that_completes_the_evidence_is_flagged():
    row = {"id": "q", "question": "Q?", "answers": ["Zarnia"], "num_docs": 2,
           "memories": ["none", "Kovan was born in Zarnia.", "Zarnia"], "final_response": "",
           "answer": None, "scores": {"sub_em": 0.0},
           "evidence": {"answer_chunk": 0, "facts": ["Kovan was born in Zarnia."],
                        "fact_chunks": [1]}}
    page = render_page([("f.jsonl", row)], "t")
    chunks = page.split('<li class="chunk')[1:]
    assert ["evidence read" in c for c in chunks] == [False, True, False]
    # a line from another agent (evidence as dialog ids) renders without the flag
    page = render_page([("f.jsonl", {**row, "evidence": ["D2:1"]})], "t")
    assert 'class="flag evidence"' not in page


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=30), st.text(max_size=30), st.text(max_size=10))
def test_model_output_never_becomes_markup(memory, response, answer):
    row = {"id": "q<1>", "question": "<script>x</script>", "answers": [answer or "a"],
           "memories": [memory], "final_response": response, "answer": response,
           "scores": {"sub_em": 0.0}, "num_docs": 2}
    page = render_page([("f.jsonl", row)], "t")
    body = page.split("<h1>", 1)[1].rsplit("<script>", 1)[0]
    assert "<script" not in body  # every text from the run is escaped
    assert "<b>" not in memory or "&lt;b&gt;" in page


def memagent_rows() -> list[dict]:
    return [
        {"id": "syn1-eval-0-0", "num_docs": 4, "question": "In which country was Kovan born?",
         "answers": ["Zarnia"], "memories": ["No previous memory", "Kovan was born in Zarnia.",
                                             "Kovan was born in Zarnia."],
         "final_response": "\\boxed{Zarnia}", "answer": "Zarnia",
         "scores": {"em": 1.0, "f1": 1.0, "sub_em": 1.0}, "num_chunks": 3, "reward": 1.0},
        {"id": "syn1-eval-0-1", "num_docs": 8, "question": "By which river does Tamo live?",
         "answers": ["Mossa"], "memories": ["Tamo lives by the Mossa river.", "Tamo"],
         "final_response": "\\boxed{Aldra}", "answer": "Aldra",
         "scores": {"em": 0.0, "f1": 0.0, "sub_em": 0.0}, "num_chunks": 2, "reward": 0.0},
    ]


def memupdate_row() -> dict:
    return {"id": "conv-1/q3", "category": 2, "question": "When did Ann move?",
            "answers": ["May 2023"], "scores": {"llm_judge": 1.0}, "reward": 0.5,
            "calls": [{"turn": 0, "name": "memory_insert", "arguments": {"text": "Ann moved"},
                       "ok": True, "result": "inserted m1"}],
            "memory_before": {"count": 0}, "memory_after": {"count": 1},
            "memory_diff": {"added_texts": [{"id": "m1", "text": "Ann moved in May 2023"}],
                            "removed_texts": [], "changed_texts": []}}


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    rows = memagent_rows()
    (tmp_path / "eval").mkdir()
    for n, row in ((4, rows[0]), (8, rows[1])):
        (tmp_path / "eval" / f"trajectories_{n}.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "locomo").mkdir()
    (tmp_path / "locomo" / "trajectories.jsonl").write_text(json.dumps(memupdate_row()) + "\n")
    # each evaluation's results.json says which agent wrote its trajectories
    for folder, benchmark in (("eval", "ruler_hqa"), ("locomo", "locomo")):
        (tmp_path / folder / "results.json").write_text(json.dumps({"benchmark": benchmark}))
    return tmp_path


def test_view_cli_writes_one_page_with_every_episode(run_dir, capsys):
    assert cli_main(["view", str(run_dir)]) == 0
    page = (run_dir / "view.html").read_text()
    assert "wrote" in capsys.readouterr().out
    assert page.count('<section class="episode') == 3
    assert "gold enters" in page and "gold leaves" in page
    assert '<mark class="gold">Zarnia</mark>' in page
    assert "memory_insert" in page and "Ann moved in May 2023" in page
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    for run in ("eval", "locomo"):  # the run filter offers each folder
        assert f'<option value="{run}">{run}</option>' in page


def test_view_of_a_directory_without_trajectories_is_one_line(tmp_path, capsys):
    assert cli_main(["view", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no trajectories file" in err and err.count("\n") == 1
    assert cli_main(["view", str(tmp_path), "steps=[one]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "steps.0:" in err and err.count("\n") == 1


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (.ci/run installs it)")
def test_page_renders_in_a_headless_browser_without_console_errors(run_dir, tmp_path):
    page = write_view(run_dir)
    proc = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--enable-logging=stderr", "--v=0",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    # The script ran (the filter counted the episodes) and the content is there.
    assert '<span id="shown">3</span>' in dom
    assert "In which country was Kovan born?" in dom and "memory_insert" in dom
    assert "gold enters" in dom
    # Chromium logs every console message (and uncaught exception) as ":CONSOLE"; the page
    # writes none, so any such line is an error.
    assert [line for line in proc.stderr.splitlines() if ":CONSOLE" in line] == []


def test_reading_a_run_imports_neither_torch_nor_transformers():
    # memrl view reads files: it starts in a second, not after importing torch (the
    # trajectory step files are read by memrl.run.trajectory_files, not the writer)
    import sys

    code = ("import sys\nimport memrl.apps.view\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('torch', 'transformers')))[:5]\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

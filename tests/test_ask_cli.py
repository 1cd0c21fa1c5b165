"""`memrl ask` on the tiny model: every document type, standard input, the trace and
`memrl view`, the settings stored with a model, and bad input as one line with exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from document_files import write_documents
from hypothesis import given
from hypothesis import strategies as st

from memrl.apps.ask.settings import STORED_CONFIG
from memrl.cli import OVERRIDE, expand_multi_value_options, main
from memrl.config import config_to_yaml
from memrl.recipes.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = "\n".join(f"Note {i}: Alice Brightwater was born in Lyon in {1900 + i}." for i in range(12))
SMALL = ["memagent.chunk_size=64", "memagent.max_memory_tokens=4",
         "memagent.max_final_tokens=4", "seed=0"]


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    return write_documents(tmp_path_factory.mktemp("docs"), TEXT)


def _ask(model, *args):
    return main(["ask", "--model", str(model), *args])


@pytest.mark.parametrize("kind", ["text", "markdown", "html", "pdf"])
def test_ask_reads_each_document_type(kind, docs, tiny_model_dir, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    code = _ask(tiny_model_dir, "--document", str(docs[kind]), "--question",
                "Where was Alice born?", *SMALL, f"ask.trace={trace}")
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(trace.read_text())
    assert out.strip() == (row["answer"] if row["answer"] is not None
                           else row["final_response"].strip())
    assert row["documents"] == [str(docs[kind])] and row["num_docs"] == 1
    assert row["num_chunks"] == len(row["memories"]) == -(-row["context_tokens"] // 64)
    assert row["context_tokens"] > 12 * 10  # the whole text was read (12 notes)
    assert f"read {row['context_tokens']:,} tokens of 1 document(s)" in err
    assert row["usage"]["total_tokens"] > row["context_tokens"]


@pytest.mark.slow
def test_show_memory_several_documents_and_memrl_view(docs, tiny_model_dir, tmp_path, capsys):
    trace = tmp_path / "ask.jsonl"
    code = _ask(tiny_model_dir, "--document", *(str(p) for p in docs.values()), "--question",
                "Where?", *SMALL, "ask.show_memory=true", f"ask.trace={trace}")
    out, err = capsys.readouterr()
    assert code == 0, err
    row = json.loads(trace.read_text())
    assert row["num_docs"] == 4
    n = row["num_chunks"]
    assert out.count("--- memory after chunk ") == n
    assert f"--- memory after chunk {n}/{n} " in out
    assert main(["view", str(trace)]) == 0
    page = (tmp_path / "ask.html").read_text()
    assert page.count('<li class="chunk') == n and "Where?" in page


def test_settings_stored_with_the_model_and_options_over_them(tiny_model_dir, tmp_path,
                                                              docs, capsys):
    model = tmp_path / "trained"
    shutil.copytree(tiny_model_dir, model)
    cfg = TrainConfig.model_validate({"model": {"path": "m"}, "data": {"train_file": "t"},
                                      "memagent": {"chunk_size": 100, "max_memory_tokens": 3,
                                                   "max_final_tokens": 5}})
    (model / STORED_CONFIG).write_text(config_to_yaml(cfg))
    rows = []
    for extra in ([], ["memagent.chunk_size=150"]):
        trace = tmp_path / f"t{len(rows)}.jsonl"
        assert _ask(model, "--document", str(docs["text"]), "--question", "Where?",
                    "ask.quiet=true", f"ask.trace={trace}", *extra) == 0
        rows.append(json.loads(trace.read_text()))
    capsys.readouterr()
    assert [r["config"]["chunk_size"] for r in rows] == [100, 150]
    assert rows[0]["config"]["max_memory_tokens"] == 3
    assert rows[0]["num_chunks"] == -(-rows[0]["context_tokens"] // 100)
    assert max(rows[0]["memory_tokens"]) <= 3


@pytest.mark.slow
def test_standard_input_in_a_real_process(tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, "-m", "memrl", "ask", "--model", str(tiny_model_dir), "--document",
         "-", "--question", "Where was Alice born?", *SMALL],
        input=TEXT.encode(), capture_output=True, env=env, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert proc.stdout.decode().strip()
    assert "chunks" in err and "tokens/s" in err  # the progress bar, drawn on stderr
    assert "read " in err and " document(s) in " in err


def _bad_inputs(tmp_path):
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "slides.pptx").write_bytes(b"PK\x03\x04")
    (tmp_path / "empty.md").write_text("")
    (tmp_path / "blank.txt").write_text("  \n\n ")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    return tmp_path


@pytest.mark.parametrize("document,question,message", [
    ("missing.txt", "Q?", "missing.txt: document not found"),
    ("binary.txt", "Q?", "binary.txt: binary file, not text"),
    ("slides.pptx", "Q?", "slides.pptx: unsupported document type '.pptx'"),
    ("empty.md", "Q?", "empty.md: empty document"),
    ("blank.txt", "Q?", "blank.txt: empty document"),
    ("latin1.txt", "Q?", "latin1.txt: not UTF-8 text"),
    ("broken.pdf", "Q?", "broken.pdf: not a readable PDF"),
    ("blank.txt", "  ", "--question: empty question"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir, tmp_path, capsys, document,
                                          question, message):
    folder = _bad_inputs(tmp_path)
    code = _ask(tiny_model_dir, "--document", str(folder / document), "--question", question)
    out, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert out == ""


@pytest.mark.parametrize("override,message", [
    ("memagent.top_p=3", "memagent.top_p: "),
    ("memagent.chunk_sise=64", "memagent.chunk_sise: unknown key"),
    ("rollout.engine=torch", "rollout.engine: "),
    ("rollout.engine=openai", "rollout.engine openai needs rollout.openai.base_urls"),
    ("model.threads=0", "model.threads: "),
    ("ask.threads=2", "ask.threads: unknown key"),
    ("serve.port=1", "serve: unknown key"),
    ("model.device=tpu", "model.device: unknown device"),
    ("model.path=elsewhere", "model.path elsewhere: the model is --model's"),
    ("agent=memupdate", "agent: memrl ask and memrl serve read with MemAgent"),
])
def test_bad_settings_name_their_key(tiny_model_dir, docs, capsys, override, message):
    assert _ask(tiny_model_dir, "--document", str(docs["text"]), "--question", "Q?",
                override) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert out == ""


def test_bad_options_name_themselves(tiny_model_dir, docs, capsys):
    assert _ask(tiny_model_dir, "--document", "-", "-", "--question", "Q?") == 2
    assert "standard input can be read once" in capsys.readouterr().err


def _ask_process(model, args, env=None, **kw):
    env = {**(os.environ if env is None else env), "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "memrl", "ask", "--model", str(model), *args,
                           *SMALL], capture_output=True, env=env, timeout=300, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("case,message", [
    ("closed stdin", "--document -: standard input is closed"),
    ("empty stdin", "standard input: empty document"),
    ("latin-1 stdin", "standard input: not UTF-8 text"),
    ("undecodable question", "--question: not valid UTF-8 text (byte 0xe9 at character 3)"),
])
def test_bad_input_in_a_real_process_is_one_line_and_exit_2(tiny_model_dir, case, message):
    question = b"caf\xe9?" if case == "undecodable question" else b"Where?"
    document = "/dev/null" if case == "undecodable question" else "-"
    kw = ({"stdin": subprocess.DEVNULL} if case == "empty stdin" else
          {"input": b"caf\xe9 text"} if case == "latin-1 stdin" else
          {"stdin": subprocess.DEVNULL, "preexec_fn": lambda: os.close(0)}
          if case == "closed stdin" else {"stdin": subprocess.DEVNULL})
    proc = _ask_process(tiny_model_dir, ["--document", document, "--question",
                                         os.fsdecode(question)], **kw)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


@pytest.mark.slow
def test_a_named_pipe_is_read_as_a_file(tiny_model_dir, tmp_path):
    """What `--document <(command)` gives: a pipe, readable once."""
    fifo = tmp_path / "notes"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"printf '%s' '{TEXT}' > {fifo}"])
    proc = _ask_process(tiny_model_dir, ["--document", str(fifo), "--question", "Where?"])
    writer.wait(timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "read " in err and " tokens of 1 document(s)" in err


def test_greedy_by_default_and_the_summary_says_what_was_read(tiny_model_dir, docs, tmp_path,
                                                               capsys):
    answers, rows = [], []
    for k in range(2):
        trace = tmp_path / f"g{k}.jsonl"
        assert _ask(tiny_model_dir, "--document", str(docs["text"]), "--question", "Where?",
                    "memagent.chunk_size=64", "memagent.max_memory_tokens=4",
                    "memagent.max_final_tokens=12", "memagent.max_chunks=2",
                    f"ask.trace={trace}") == 0
        out, err = capsys.readouterr()
        answers.append(out)
        rows.append(json.loads(trace.read_text()))
    assert answers[0] == answers[1] and rows[0]["config"]["temperature"] == 0
    row = rows[0]
    total_chunks = -(-row["context_tokens"] // 64)
    assert row["capped"] and row["document_tokens_read"] == 128 < row["context_tokens"]
    assert (f"read 128 of {row['context_tokens']:,} tokens of 1 document(s) in 2 of "
            f"{total_chunks} chunks") in err


def test_one_torch_thread_unless_model_threads_says(tiny_model_dir, docs):
    """In a process of its own: a test process's torch threads are set by conftest, and
    vLLM's CPU worker, run in-process by an earlier test, replaces `torch.set_num_threads`
    with a no-op in the process it ran in (vllm/v1/worker/cpu_worker.py)."""
    env_threads = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    for extra, expected in (((), ", 1 thread)"), (("model.threads=2",), ", 2 threads)")):
        run = _ask_process(tiny_model_dir, ["--document", str(docs["text"]), "--question",
                                            "Q?", "model.device=cpu", *extra], env=env_threads)
        assert run.returncode == 0, run.stderr.decode()
        assert expected in run.stderr.decode()


def test_a_config_file_then_overrides_given_after_the_documents(tiny_model_dir, docs,
                                                                 tmp_path, capsys):
    """`memrl ask ... CONFIG key.path=value`: the file's settings, the overrides over them
    (an override ends --document's list), sampling from rollout.* over the agent's."""
    config = tmp_path / "ask.yaml"
    config.write_text("seed: 3\nmemagent: {chunk_size: 80, max_memory_tokens: 4, "
                      "max_final_tokens: 4}\nrollout: {temperature: 1.0, top_p: 0.9}\n"
                      "ask: {quiet: true}\n")
    trace = tmp_path / "t.jsonl"
    assert main(["ask", str(config), "--model", str(tiny_model_dir), "--document",
                 str(docs["text"]), "memagent.chunk_size=100", f"ask.trace={trace}",
                 "--question", "Where?"]) == 0
    out, err = capsys.readouterr()
    row = json.loads(trace.read_text())
    assert err == "" and out.strip()
    assert row["documents"] == [str(docs["text"])]
    assert {k: row["config"][k] for k in ("chunk_size", "max_memory_tokens", "temperature",
                                          "top_p", "seed")} == {
        "chunk_size": 100, "max_memory_tokens": 4, "temperature": 1.0, "top_p": 0.9,
        "seed": 3}


_NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1)


@given(documents=st.lists(_NAMES.filter(lambda t: not t.startswith("-") or t == "-")
                          .filter(lambda t: not OVERRIDE.match(t)), min_size=1, max_size=4),
       overrides=st.lists(st.from_regex(r"[a-z_]{1,8}(\.[a-z_0-9]{1,8}){0,2}=[^\n]{0,8}",
                                        fullmatch=True), max_size=3))
def test_an_override_ends_the_documents(documents, overrides):
    argv = ["ask", "--document", *documents, *overrides, "--question", "Q"]
    assert expand_multi_value_options(argv) == [
        "ask", *[x for d in documents for x in ("--document", d)], *overrides, "--question",
        "Q"]

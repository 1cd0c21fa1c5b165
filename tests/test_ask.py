"""`memrl.apps.ask`: documents read as streams, chunks cut as they are read (exactly as the whole
text would be), settings stored with a model, and the ask() function on MemAgent.aread."""

from __future__ import annotations

import asyncio
import io
import json

from pathlib import Path

import pytest
from document_files import write_documents, write_pdf
from helpers import ScriptedAsyncEngine, assert_same_trajectories
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memrl.agents.memagent import MemAgent, MemAgentConfig, chunk_context
from memrl.apps.ask import AskProgress, ask
from memrl.apps.ask import documents as documents_module
from memrl.apps.ask.chunking import BLOCK_CHARS, DocumentChunks, TooManyTokens, safe_cut, text_blocks
from memrl.apps.ask.documents import html_pieces, html_text, open_document, spool_stdin
from memrl.apps.ask.settings import STORED_CONFIG, agent_config, stored_settings
from memrl.config import config_to_yaml
from memrl.data.records import QARecord
from memrl.errors import MemrlInputError
from memrl.inference.base import SamplingParams
from memrl.inference.scripted import ScriptedGenerator
from memrl.recipes.config import TrainConfig
from memrl.apps.serve.batching import BatchingEngine

TEXT = "\n".join(
    f"Line {i}: Alice Brightwater was born in Lyon in {1900 + i}, and worked as a writer; "
    f"her daughter moved to Paris."
    for i in range(40)
)
WORDS = st.text(alphabet="abcdefgh XYZ09.,'é中\n\t", min_size=1, max_size=8)


# ---- chunking --------------------------------------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet="ab cd\n\t.,'09é中-", min_size=2, max_size=60),
       limit=st.integers(1, 59))
def test_a_safe_cut_tokenizes_both_sides_as_the_whole(tiny_tokenizer, text, limit):
    cut = safe_cut(text, limit)
    assert cut == len(text) if len(text) <= limit else 0 < cut <= limit
    if cut < len(text) and cut != limit:  # a safe cut was found: exact
        encode = lambda s: tiny_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
        assert encode(text[:cut]) + encode(text[cut:]) == encode(text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(WORDS, min_size=1, max_size=120), seps=st.sampled_from([" ", "\n"]),
       chunk_size=st.integers(1, 40), block_chars=st.integers(24, 200))
def test_streamed_chunks_equal_the_whole_text_chunks(tiny_tokenizer, words, seps, chunk_size,
                                                     block_chars):
    text = seps.join(w.strip() or "x" for w in words)
    streamed = DocumentChunks(tiny_tokenizer, [open_document(text)], chunk_size,
                              block_chars=block_chars)
    whole = chunk_context(tiny_tokenizer, text, chunk_size)
    assert list(streamed) == whole.texts
    assert (streamed.num_chunks, streamed.context_tokens, streamed.capped) == (
        whole.num_chunks, whole.context_tokens, whole.capped)


@pytest.mark.parametrize("chunk_size", [1, 5])
def test_lines_without_spaces_stream_as_the_whole_text(tiny_tokenizer, chunk_size):
    """Found by the property above (CI, 2026-11-27): lines with no space were cut where the
    block ended, inside '000ad' ('000a' | 'd'); a single newline is now a safe cut too."""
    words = ["0"] * 5 + ["00"] * 3 + ["0000", "00000", "00000", "000000", "0000000",
                                      "0000000", "00000000", "000ad"]
    text = "\n".join(words)
    streamed = DocumentChunks(tiny_tokenizer, [open_document(text)], chunk_size, block_chars=24)
    whole = chunk_context(tiny_tokenizer, text, chunk_size)
    assert list(streamed) == whole.texts
    assert streamed.context_tokens == whole.context_tokens


@pytest.mark.parametrize("max_chunks,truncation", [(None, "right"), (3, "right"),
                                                   (3, "center"), (4, "center"), (99, "center")])
@pytest.mark.parametrize("block_chars", [100, 1000, BLOCK_CHARS])
def test_max_chunks_and_truncation_as_split_token_ids(tiny_tokenizer, max_chunks, truncation,
                                                      block_chars):
    streamed = DocumentChunks(tiny_tokenizer, [open_document(TEXT)], 50, max_chunks,
                              truncation, block_chars=block_chars)
    whole = chunk_context(tiny_tokenizer, TEXT, 50, max_chunks, truncation)
    assert list(streamed) == whole.texts
    assert list(streamed) == whole.texts  # each iteration reads from the start
    assert (streamed.num_chunks, streamed.context_tokens, streamed.capped) == (
        whole.num_chunks, whole.context_tokens, whole.capped)


def test_text_blocks_cut_at_spaces_and_never_lose_text():
    text = "one two three four five six seven eight nine ten " * 20
    blocks = list(text_blocks(iter([text[:37], text[37:]]), 50))
    assert "".join(blocks) == text
    assert all(len(b) <= 50 for b in blocks)
    assert all(not b[-1].isspace() for b in blocks[:-1])
    assert all(b.startswith(" ") for b in blocks[1:])
    assert list(text_blocks(["x" * 120], 50)) == ["x" * 50, "x" * 50, "x" * 20]


def test_several_documents_are_rendered_as_in_ruler_hqa(tiny_tokenizer):
    chunks = DocumentChunks(tiny_tokenizer, [open_document("First text.", 1),
                                             open_document("Second text.", 2)], 1000)
    assert list(chunks) == ["Document 1:\ntext 1\nFirst text.\n\nDocument 2:\ntext 2\n"
                            "Second text."]


def test_a_file_is_titled_by_its_name_wherever_the_command_runs(tiny_tokenizer, tmp_path,
                                                                 monkeypatch):
    """The prompt holds a file's name, not the path as typed: the same files read from
    another directory give the agent the same text."""
    (tmp_path / "papers").mkdir()
    for name, text in (("a.txt", "First text."), ("b.md", "Second text.")):
        (tmp_path / "papers" / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    here = list(DocumentChunks(tiny_tokenizer, [open_document(Path("papers/a.txt")),
                                                open_document(Path("papers/b.md"), 2)], 1000))
    monkeypatch.chdir(tmp_path / "papers")
    there = list(DocumentChunks(tiny_tokenizer, [open_document(Path("a.txt")),
                                                 open_document(Path("./b.md"), 2)], 1000))
    assert here == there == ["Document 1:\na.txt\nFirst text.\n\nDocument 2:\nb.md\n"
                             "Second text."]
    assert open_document(Path("a.txt")).name == "a.txt"  # errors still name the path given


def test_a_token_limit_is_refused_while_counting(tiny_tokenizer):
    with pytest.raises(TooManyTokens, match="more than 10 tokens") as err:
        DocumentChunks(tiny_tokenizer, [open_document(TEXT)], 50, max_tokens=10)
    assert err.value.limit == 10


# ---- documents ---------------------------------------------------------------------------

def _text(doc) -> str:
    return "".join(doc.pieces())


def test_text_markdown_html_and_pdf_are_read_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(documents_module, "READ_CHARS", 100)  # many pieces
    files = write_documents(tmp_path, TEXT)
    text = open_document(files["text"])
    assert text.kind == "text" and _text(text) == TEXT
    assert len(list(text.pieces())) > 10
    assert _text(open_document(files["markdown"])) == "# Notes\n\n" + TEXT
    html = _text(open_document(files["html"]))
    assert html.rstrip("\n").split("\n") == ["Notes", *TEXT.split("\n")]
    pdf = _text(open_document(files["pdf"]))
    assert " ".join(pdf.split()) == " ".join(TEXT.split())


def test_pdf_pages_are_read_one_at_a_time(tmp_path):
    path = write_pdf(tmp_path / "three.pdf", ["First page.", "Second page.", "Third page."])
    assert list(open_document(path).pieces()) == ["First page.\n\n", "Second page.\n\n",
                                                  "Third page."]


def test_html_text_keeps_what_a_reader_sees():
    page = ("<html><head><title>T &amp; C</title><style>b {}</style><meta charset=utf-8>"
            "</head><body><script>if (a < b) {}</script><!-- note -->"
            "<h1>Head  line</h1><p>One\n  two <b>bold</b>&nbsp;three &lt;x&gt;</p>"
            "<ul><li>a</li><li>b</li></ul><pre>  keep\n    this</pre>"
            "<noscript>no</noscript>tail<br>end</body></html>")
    assert html_text(page) == ("T & C\nHead line\nOne two bold\xa0three <x>\na\nb\nkeep\n"
                               "this\ntail\nend")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.lists(st.sampled_from(["<p>", "</p>", "<div>", "</div>", "<br>", "<b>", "</b>",
                                      "word ", "mot ", "é", "中文 ", "&amp; ", "\n",
                                      "<script>x<y</script>"]), max_size=60),
       piece=st.integers(1, 40))
def test_html_streamed_in_pieces_reads_as_whole(tmp_path_factory, body, piece):
    page = "<html><body>" + "".join(body) + "</body></html>"
    path = tmp_path_factory.mktemp("html") / "p.html"
    path.write_bytes(page.encode("utf-8"))
    streamed = "".join(html_pieces(path, piece))
    assert " ".join(streamed.split()) == " ".join(html_text(page).split())


def test_html_charset_from_meta(tmp_path):
    path = tmp_path / "latin.html"
    path.write_bytes('<meta charset="iso-8859-1"><p>caf\xe9</p>'.encode("latin-1"))
    assert _text(open_document(path)).strip() == "café"


@pytest.mark.parametrize("name,content,message", [
    ("missing.txt", None, "document not found"),
    ("notes.docx", b"PK\x03\x04", "unsupported document type '.docx'"),
    ("image.png", b"\x89PNG", "unsupported document type '.png'"),
    ("data.txt", b"abc\x00\x01def", "binary file, not text"),
    ("doc.pdf", b"%PDF-1.4 garbage, not a PDF", "not a readable PDF"),
])
def test_bad_files_are_refused_where_they_enter(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(MemrlInputError, match=message) as err:
        _text(open_document(path))
    assert str(path) in str(err.value)


def test_a_directory_is_not_a_document(tmp_path):
    with pytest.raises(MemrlInputError, match="is a directory"):
        open_document(tmp_path)


@pytest.mark.parametrize("content,message", [
    (b"", "empty document"), (b" \n\n\t ", "empty document"),
    (b"caf\xe9 latin-1 text", "not UTF-8 text"),
])
def test_empty_and_undecodable_documents_fail_when_counted(tmp_path, tiny_tokenizer, content,
                                                            message):
    path = tmp_path / "doc.txt"
    path.write_bytes(content)
    with pytest.raises(MemrlInputError, match=message) as err:
        DocumentChunks(tiny_tokenizer, [open_document(path)], 10)
    assert str(path) in str(err.value)


def test_a_pdf_without_text_is_empty(tmp_path, tiny_tokenizer):
    path = write_pdf(tmp_path / "blank.pdf", ["", ""])
    with pytest.raises(MemrlInputError, match="empty document"):
        DocumentChunks(tiny_tokenizer, [open_document(path)], 10)


@pytest.mark.parametrize("data,suffix", [(b"%PDF-1.7 ...", ".pdf"),
                                         (b"  <!DOCTYPE html><html>", ".html"),
                                         (b"plain words", ".txt")])
def test_standard_input_is_spooled_by_what_it_holds(data, suffix):
    path = spool_stdin(io.BytesIO(data))
    assert path.suffix == suffix and path.read_bytes() == data
    path.unlink()


# ---- settings stored with a model ------------------------------------------------------

def _train_yaml(**memagent) -> str:
    cfg = TrainConfig.model_validate({"model": {"path": "m"}, "data": {"train_file": "t"},
                                      "memagent": memagent})
    return config_to_yaml(cfg)


def test_settings_come_from_the_exported_config_then_the_options(tmp_path):
    (tmp_path / STORED_CONFIG).write_text(_train_yaml(chunk_size=321, max_memory_tokens=77,
                                                      max_chunks=4,
                                                      prompts="memagent-answer-is"))
    stored = stored_settings(tmp_path)
    assert stored.values == {"chunk_size": 321, "max_memory_tokens": 77,
                             "max_final_tokens": 1024, "prompts": "memagent-answer-is"}
    assert stored.source == tmp_path / STORED_CONFIG and stored.agent == "memagent"
    cfg = agent_config(stored, {"chunk_size": 100, "seed": None})
    assert (cfg.chunk_size, cfg.max_memory_tokens, cfg.max_chunks, cfg.temperature) == (
        100, 77, None, 0.7)
    with pytest.raises(MemrlInputError, match="memagent.top_p"):
        agent_config(stored, {"top_p": 2.0})


def test_settings_of_a_checkpoint_model_dir(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "trainer_state.json").write_text("{}")
    (tmp_path / "config.yaml").write_text(_train_yaml(chunk_size=64))
    assert stored_settings(tmp_path / "model").values["chunk_size"] == 64
    assert stored_settings(tmp_path).values == {}  # no config beside a plain directory
    assert agent_config(stored_settings(None)) == MemAgentConfig()


def test_a_stored_config_that_no_longer_validates_names_file_and_key(tmp_path):
    (tmp_path / STORED_CONFIG).write_text("memagent:\n  chunk_size: 0\n  gone: 1\n")
    with pytest.raises(MemrlInputError, match="chunk_size") as err:
        stored_settings(tmp_path)
    assert STORED_CONFIG in str(err.value) and "gone: unknown key" in str(err.value)


# ---- the agent: aread is arun's episode, ask() on top of it ------------------------------

def _respond(prompt: str, seed: int | None) -> str:
    if "<section>" in prompt:
        section = prompt.split("<section>\n", 1)[1].split("\n</section>", 1)[0]
        return f"saw {section.split()[0]} ({seed % 97 if seed is not None else 'x'})"
    return "The answer is \\boxed{Lyon}."


def test_aread_is_the_episode_arun_runs(tiny_tokenizer):
    engine = ScriptedAsyncEngine(tiny_tokenizer, _respond)
    cfg = MemAgentConfig(chunk_size=40, max_memory_tokens=12, max_final_tokens=12, seed=3)
    agent = MemAgent(engine, cfg)
    record = QARecord(id="q1", question="Where was Alice born?", answers=["Lyon"],
                      context=TEXT[:900])
    [by_arun] = asyncio.run(agent.arun([record]))
    by_aread = asyncio.run(agent.aread(record.question, agent.chunk(record), episode_id="q1",
                                       keep_token_ids=True))
    streamed = DocumentChunks(tiny_tokenizer, [open_document(record.context)], 40,
                              block_chars=100)
    by_stream = asyncio.run(agent.aread(record.question, streamed, episode_id="q1",
                                        keep_token_ids=True))
    assert_same_trajectories([by_arun], [by_aread])
    assert_same_trajectories([by_arun], [by_stream])


def test_ask_answers_with_memories_usage_and_a_trace_memrl_view_renders(tmp_path,
                                                                        tiny_tokenizer):
    from memrl.apps.view import write_view

    engine = ScriptedAsyncEngine(tiny_tokenizer, _respond)
    events: list[AskProgress] = []
    files = write_documents(tmp_path / "docs", TEXT)
    result = ask(engine, [files["text"], "A second, inline document."], "Where?",
                 config={"chunk_size": 60, "max_memory_tokens": 16, "max_final_tokens": 16},
                 progress=events.append)
    assert result.answer == "Lyon" and result.text == "Lyon"
    assert result.num_chunks == len(result.memories) == len(events) - 1 > 5
    assert [e.chunks_read for e in events] == [*range(1, result.num_chunks + 1),
                                               result.num_chunks]
    assert events[-1].done and events[-1].document_tokens_read == result.context_tokens
    assert result.memories[0].startswith("saw Document")
    turns = result.trajectory.turns
    assert result.usage.prompt_tokens == sum(t.prompt_tokens for t in turns)
    assert result.usage.total_tokens > result.context_tokens
    assert events[-1].usage == result.usage
    assert not any(t.prompt_ids for t in turns)  # no token ids kept
    row = result.trace_row()
    assert json.loads(json.dumps(row)) == row
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps(row) + "\n")
    page = write_view(trace).read_text()
    assert page.count('<li class="chunk') == result.num_chunks
    assert "ungraded" in page and "Where?" in page


def test_ask_with_a_model_directory_loads_it_after_checking_the_input(tiny_model_dir,
                                                                      tmp_path):
    with pytest.raises(MemrlInputError, match="document not found"):
        ask(tmp_path / "no-model-here", [tmp_path / "missing.txt"], "Where?")
    result = ask(tiny_model_dir, TEXT[:400], "Where?", config={
        "chunk_size": 32, "max_memory_tokens": 3, "max_final_tokens": 3, "seed": 0})
    assert result.num_chunks == len(result.memories) == -(-result.context_tokens // 32)
    assert result.model == str(tiny_model_dir) and result.config.chunk_size == 32
    assert all(t.response_tokens <= 3 for t in result.trajectory.turns)


def test_ask_checks_question_and_documents(tiny_tokenizer, tmp_path):
    engine = ScriptedAsyncEngine(tiny_tokenizer, _respond)
    with pytest.raises(MemrlInputError, match="empty question"):
        ask(engine, ["text"], "  ")
    with pytest.raises(MemrlInputError, match="no document"):
        ask(engine, [], "Where?")
    with pytest.raises(MemrlInputError, match="document not found"):
        ask(engine, [tmp_path / "nope.md"], "Where?")


# ---- batching concurrent requests on the HF engine ---------------------------------------

def test_batching_engine_answers_concurrent_requests_in_batches(tiny_tokenizer):
    scripted = ScriptedGenerator(tiny_tokenizer, lambda prompt: f"echo {prompt[-5:]}")
    engine = BatchingEngine(scripted, gather_wait_s=0.05)
    prompts = [tiny_tokenizer.encode(f"prompt number {i}") for i in range(12)]
    short, long = SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=9)

    async def run():
        return await asyncio.gather(*(engine.agenerate(p, short if i % 3 else long)
                                      for i, p in enumerate(prompts)))

    try:
        generations = asyncio.run(run())
    finally:
        engine.close()
    for prompt, gen, i in zip(prompts, generations, range(12), strict=True):
        want = scripted.generate([prompt], short if i % 3 else long)[0]
        assert gen.token_ids == want.token_ids
    assert sorted(scripted.calls[:2]) == [4, 8]  # two batches: one per sampling setting
    assert engine.stats == {"calls": 2, "requests": 12, "largest_batch": 8}
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(engine.agenerate(prompts[0], short))


def test_batching_engine_passes_a_failure_to_every_request(tiny_tokenizer):
    def fail(prompt: str) -> str:
        raise ValueError("model broke")

    engine = BatchingEngine(ScriptedGenerator(tiny_tokenizer, fail))

    async def run():
        return await asyncio.gather(*(engine.agenerate([5, 6], SamplingParams())
                                      for _ in range(3)), return_exceptions=True)

    try:
        results = asyncio.run(run())
    finally:
        engine.close()
    assert [str(r) for r in results] == ["model broke"] * 3


def test_reading_a_file_path_given_as_str_is_its_text():
    """A str is the document's text, never a path (a path is an os.PathLike)."""
    doc = open_document("notes.txt")
    assert doc.kind == "text" and _text(doc) == "notes.txt" and doc.path is None

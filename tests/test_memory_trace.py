"""Memory diagnostics: the evidence checks (hand-computed), the per-chunk traces and their
aggregation, and the files a RULER-HQA evaluation writes for an oracle and a forgetful agent."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from memrl.agents import MemAgentConfig
from memrl.agents.oracle import OracleGenerator
from memrl.data.records import Document, QARecord, supporting_facts
from memrl.data.ruler_hqa import load_ruler_hqa, ruler_hqa_path, write_ruler_hqa
from memrl.data.synthetic import make_synthetic_records
from memrl.eval.memory_trace import (
    DIAGNOSTICS_FILE,
    DIAGNOSTICS_PLOT,
    aggregate_traces,
    chunk_rows,
    final_memory_about,
    memory_subject,
    memory_per_session,
    session_line,
    sessions_read,
    summary_line,
)
from memrl.eval.ruler_hqa import evaluate_ruler_hqa
from memrl.inference.scripted import ScriptedGenerator
from memrl.rewards.evidence import (
    answer_in_text,
    evidence_chunk,
    fact_in_text,
    facts_in_text,
    key_words,
    locate_evidence,
)

# ---------------------------------------------------------------- the checks


def test_answer_in_text_is_normalised_and_whole_words():
    assert answer_in_text("Kovan was born in ZARNIA.", ["Zarnia"]) is True
    assert answer_in_text("Zarnians live here", ["Zarnia"]) is False
    assert answer_in_text("it flows: Seine, then sea", ["the Seine"]) is True
    assert answer_in_text("nothing", ["x", "Seine"]) is False
    assert answer_in_text("yes, it is", ["Yes"]) is None  # not a span of the context
    assert answer_in_text("anything", ["!!", "the"]) is None  # normalises to nothing


def test_key_words_and_facts_in_text():
    assert key_words("Kovan was born in Zarnia.") == {"kovan", "zarnia"}
    assert key_words("The people of Brastor speak Zarnish.") == {"brastor", "zarnish"}
    assert key_words("Ada (born 1815) wrote notes.") == {"ada", "1815"}
    assert key_words("it rained all day.") == {"it", "rained", "all", "day"}
    assert fact_in_text("kovan: born, zarnia", "Kovan was born in Zarnia.")
    assert not fact_in_text("Kovan was born somewhere", "Kovan was born in Zarnia.")
    facts = ["Kovan was born in Zarnia.", "Brastor lies on the Aldra river."]
    assert facts_in_text("Kovan, Zarnia; Brastor", facts) == 0.5
    assert facts_in_text("Kovan Zarnia Brastor Aldra", facts) == 1.0
    assert facts_in_text("anything", []) is None


def test_locate_evidence_finds_the_chunk_that_completes_each_fact():
    chunks = ["Doc 1. Kovan was ", "born in Zarnia. Lon", "don is far. Zarnia"]
    fact = "Kovan was born in Zarnia."
    ev = locate_evidence(chunks, ["Zarnia"], [fact, "Missing fact."])
    assert ev == {"answer_chunk": 1, "facts": [fact, "Missing fact."], "fact_chunks": [1, None]}
    # an answer cut by a chunk boundary is found in the later chunk
    assert locate_evidence(chunks, ["London"])["answer_chunk"] == 2
    assert locate_evidence(chunks, ["Paris"])["answer_chunk"] is None
    assert locate_evidence(chunks, ["yes"])["answer_chunk"] is None
    assert locate_evidence(["a", "b"], ["b"])["fact_chunks"] == []


def test_evidence_chunk_prefers_the_facts():
    assert evidence_chunk({"answer_chunk": 0, "facts": ["a", "b"], "fact_chunks": [3, 1]}) == 3
    assert evidence_chunk({"answer_chunk": 0, "facts": ["a", "b"], "fact_chunks": [3, None]}) \
        is None
    assert evidence_chunk({"answer_chunk": 2, "facts": [], "fact_chunks": []}) == 2
    assert evidence_chunk(None) is None
    for malformed in (["D2:1"], {"facts": ["a"], "fact_chunks": []}, {"answer_chunk": True},
                      {"facts": ["a"], "fact_chunks": "3"}, {}):
        assert evidence_chunk(malformed) is None


def test_supporting_facts_come_from_the_record_or_its_gold_documents():
    docs = [Document(title="A", text="Ann was born in Rome. She sang.", is_supporting=True),
            Document(title="B", text="Bo lives in Oslo.", is_supporting=False)]
    assert supporting_facts(QARecord(id="1", question="Q", answers=["Rome"],
                                     documents=docs)) == ["Ann was born in Rome."]
    assert supporting_facts(QARecord(id="1", question="Q", answers=["x"], context="c",
                                     facts=["F one.", " "])) == ["F one."]
    assert supporting_facts(QARecord(id="1", question="Q", answers=["x"], context="c")) == []


# ---------------------------------------------------------------- traces and aggregation

FACT = "Kovan was born in Zarnia."
EVIDENCE = {"answer_chunk": 0, "facts": [FACT], "fact_chunks": [1]}


def line(memories, tokens, evidence=EVIDENCE):
    row = {"id": "x", "sample_index": 0, "answers": ["Zarnia"], "memories": memories,
           "memory_tokens": tokens}
    return row if evidence is None else {**row, "evidence": evidence}


KEEPER = line(["No info", "Kovan born Zarnia", "Kovan born Zarnia"], [2, 4, 4])
FORGETTER = line(["Zarnia?", "Zarnia", "nothing"], [2, 1, 1])
OLD = line(["a", "Zarnia"], [1, 1], evidence=None)  # written before diagnostics existed


def test_chunk_rows_of_one_episode():
    assert chunk_rows(FORGETTER) == [
        {"chunk": 0, "answer_in_memory": True, "facts_in_memory": 0.0, "evidence_seen": False,
         "memory_tokens": 2, "memory_chars": 7},
        {"chunk": 1, "answer_in_memory": True, "facts_in_memory": 0.0, "evidence_seen": True,
         "memory_tokens": 1, "memory_chars": 6},
        {"chunk": 2, "answer_in_memory": False, "facts_in_memory": 0.0, "evidence_seen": True,
         "memory_tokens": 1, "memory_chars": 7},
    ]
    rows = chunk_rows(OLD)
    assert [r["evidence_seen"] for r in rows] == [None, None]
    assert [r["facts_in_memory"] for r in rows] == [None, None]


def test_aggregate_traces_hand_computed():
    agg = aggregate_traces([KEEPER, FORGETTER, OLD])
    assert agg["episodes"] == 3
    assert agg["by_chunk"] == {
        "episodes": [3, 3, 2],
        "answer_in_memory": [1 / 3, 1.0, 0.5],
        "facts_in_memory": [0.0, 0.5, 0.5],
        "evidence_seen": [0.0, 1.0, 1.0],
        "memory_tokens": [5 / 3, 2.0, 2.5],
        "memory_chars": [(7 + 7 + 1) / 3, (17 + 6 + 6) / 3, (17 + 7) / 2],
    }
    # chunk 1 completes the evidence of the two new lines: d = 0, 1 after it
    assert agg["after_evidence"] == {"episodes": [2, 2], "answer_in_memory": [1.0, 0.5],
                                     "facts_in_memory": [0.5, 0.5]}
    assert agg["summary"] == {
        "answer_in_final_memory": 2 / 3, "facts_in_final_memory": 0.5,
        "evidence_located": 2, "captured": 1.0, "kept_to_end": 0.5,
        "answer_before_evidence": 0.5,
        "memory_tokens_mean": 16 / 8, "memory_tokens_max": 4,
        "memory_chars_mean": (7 + 17 + 17 + 7 + 6 + 7 + 1 + 6) / 8,
        "final_memory_about": None,  # no biographies question
    }
    line_text = summary_line(4, agg)
    assert line_text.startswith("N=4 memory: gold answer in the final memory 67%")
    assert "captured once read 100% of 2, kept to the end 50%" in line_text
    assert "supporting facts in the final memory 50%" in line_text
    assert "2 tokens per memory (max 4)" in line_text
    empty = aggregate_traces([])
    assert empty["episodes"] == 0 and empty["by_chunk"]["episodes"] == []
    assert empty["summary"]["captured"] is None


def test_memory_subject_by_hand():
    """Whom a final memory is about: the asked person's full name (whole words), only their
    first or last name (a namesake), someone else, or nobody."""
    name = "Dajal Brouwick"
    assert memory_subject(name, "Dajal Brouwick's place of birth is Fuminster.") == "asked"
    assert memory_subject(name, "Dajal Kromsen was born in 1950. Dajal Brouwick too.") == "asked"
    assert memory_subject(name, "Dajal Kromsen was born in Peru.") == "namesake"
    assert memory_subject(name, "Mika Brouwick's home is Lund.") == "namesake"
    assert memory_subject(name, "Dajal Brouwickson lives in Lund.") == "namesake"  # not in full
    assert memory_subject(name, "Mika Dajalson plays the oboe.") == "other"  # not a name part
    assert memory_subject(name, "No previous memory") == "empty"
    assert memory_subject(name, "  ") == "empty"
    assert memory_subject(name, "Nothing yet", no_memory="Nothing yet") == "empty"
    rows = [{"question": "Where was Dajal Brouwick born?", "memories": ["a", m]}
            for m in ("Dajal Brouwick: Lund", "Dajal Lo: Oslo", "Mika Lo", "")]
    rows.append({"question": "Who wrote Hamlet?", "memories": ["Shakespeare"]})  # not counted
    assert final_memory_about(rows) == {"asked": 1, "namesake": 1, "other": 1, "empty": 1}
    assert final_memory_about(rows[-1:]) is None and final_memory_about([]) is None
    assert aggregate_traces(rows)["summary"]["final_memory_about"]["namesake"] == 1


def memupdate_line(evidence, ops, before, after):
    return {"evidence": evidence, "memory_before": before, "memory_after": after,
            "scores": {**dict(zip(("inserts", "updates", "deletes", "searches"), ops,
                                  strict=True)), "tool_calls": sum(ops)}}


def test_memory_per_session_hand_computed():
    rows = [
        memupdate_line(["D2:1", "D3:4; D3:5"], (4, 2, 0, 1), {"count": 10, "chars": 100},
                       {"count": 13, "chars": 160}),
        memupdate_line(["D5:1"], (1, 0, 1, 0), {"count": 4, "chars": 40},
                       {"count": 4, "chars": 50}),
        memupdate_line([], (0, 0, 0, 0), {"count": 2}, {"count": 2}),  # no chars logged
    ]
    assert [sessions_read(r) for r in rows] == [2, 1, 1]
    m = memory_per_session(rows)
    assert m["per_session"] == pytest.approx({
        "inserts": 1.0, "updates": 1 / 3, "deletes": 1 / 3, "searches": 1 / 6,
        "calls": (7 / 2 + 2 / 1 + 0) / 3, "growth_entries": 0.5, "growth_chars": 20.0})
    assert {k: v for k, v in m.items() if k != "per_session"} == pytest.approx({
        "sessions": 4 / 3, "memory_entries_initial": 16 / 3, "memory_entries_final": 19 / 3,
        "memory_chars_initial": 70.0, "memory_chars_final": 105.0})
    assert session_line("all", m) == (
        "all: 1.33 sessions read per episode; per session 1.83 tool calls: 1.00 inserts, "
        "0.33 updates, "
        "0.33 deletes, 0.17 searches; memory 5.33 → 6.33 entries, 70.00 → 105.00 chars")


# ---------------------------------------------------------------- the evaluation writes them

CONFIG = MemAgentConfig(chunk_size=24, max_memory_tokens=48, max_final_tokens=16,
                        temperature=0.0)
NUM_DOCS = (4, 8)


@pytest.fixture()
def synthetic_dir(tmp_path):
    pool = make_synthetic_records(16, 1, seed=5, hops=1, entities="eval")
    write_ruler_hqa(pool, tmp_path / "data", list(NUM_DOCS), seed=1, num_questions=5)
    return tmp_path / "data"


def records_of(data, n):
    return load_ruler_hqa(ruler_hqa_path(data, n))


def oracle(tokenizer, records):
    """Keeps in memory exactly the facts read so far (one generator per N: the oracle finds
    a record by its question, and every N asks the same questions)."""
    return OracleGenerator(tokenizer, records, CONFIG)


def forgetful(tokenizer, records):
    """The oracle's memory only in the chunk where a fact completes; forgotten after."""
    teacher = OracleGenerator(tokenizer, records, CONFIG)
    last: dict[str, str] = {}

    def respond(prompt: str) -> str:
        memory = teacher.respond(prompt)
        if "Updated memory:" not in prompt:
            return memory
        question = re.search(r"<problem> \n(.*)\n</problem>", prompt).group(1)
        new = memory != last.get(question, "No previous memory")
        last[question] = memory
        return memory if new else "No previous memory"

    return ScriptedGenerator(tokenizer, respond)


def run(make, tokenizer, data, out, ns=NUM_DOCS, **kwargs):
    """Evaluate each N in turn into `out` (additive); the diagnostics JSON and the output."""
    console = Console(file=io.StringIO(), width=300)
    for n in ns:
        evaluate_ruler_hqa(make(tokenizer, records_of(data, n)), data, [n], config=CONFIG,
                           out_dir=out, model_name="scripted", console=console,
                           show_progress=False, **kwargs)
    return json.loads((out / DIAGNOSTICS_FILE).read_text()), console.file.getvalue()


def trajectories(out, n):
    return [json.loads(x) for x in (out / f"trajectories_{n}.jsonl").read_text().splitlines()]


def test_an_oracle_keeps_the_answer_once_its_evidence_is_read(tmp_path, synthetic_dir,
                                                             tiny_tokenizer):
    assert all(r.facts for n in NUM_DOCS for r in records_of(synthetic_dir, n))
    diag, printed = run(oracle, tiny_tokenizer, synthetic_dir, tmp_path / "run")
    assert (tmp_path / "run" / DIAGNOSTICS_PLOT).read_bytes()[:4] == b"\x89PNG"
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    for n in NUM_DOCS:
        d = diag["per_num_docs"][str(n)]
        rows = trajectories(tmp_path / "run", n)
        assert d["episodes"] == len(rows) == 5
        assert d["summary"]["evidence_located"] == 5
        assert set(d["after_evidence"]["answer_in_memory"]) == {1.0}
        assert set(d["after_evidence"]["facts_in_memory"]) == {1.0}
        assert d["summary"]["captured"] == d["summary"]["kept_to_end"] == 1.0
        assert d["summary"]["answer_before_evidence"] == 0.0
        assert d["summary"]["facts_in_final_memory"] == 1.0
        assert d["by_chunk"]["episodes"][0] == 5
        assert len(d["by_chunk"]["memory_tokens"]) == max(r["num_chunks"] for r in rows)
        assert results["results"][str(n)]["memory"] == d["summary"]
        assert f"N={n} memory: gold answer in the final memory 100%" in printed


def test_a_forgetful_agent_drops_it_and_a_resumed_run_writes_the_same(tmp_path, synthetic_dir,
                                                                      tiny_tokenizer):
    whole, _ = run(forgetful, tiny_tokenizer, synthetic_dir, tmp_path / "a")
    for n in NUM_DOCS:
        d = whole["per_num_docs"][str(n)]
        rows = trajectories(tmp_path / "a", n)
        at_end = sum(evidence_chunk(r["evidence"]) == r["num_chunks"] - 1 for r in rows)
        curve = d["after_evidence"]["answer_in_memory"]
        assert curve[0] == 1.0 and set(curve[1:]) == {0.0}
        assert d["summary"]["kept_to_end"] == at_end / len(rows) < 1.0
    # the same evaluation, interrupted after two records and finished by a second run
    run(forgetful, tiny_tokenizer, synthetic_dir, tmp_path / "b", ns=[4], limit=2,
        records_per_run=1)
    resumed, _ = run(forgetful, tiny_tokenizer, synthetic_dir, tmp_path / "b")
    assert resumed == whole


def test_the_evaluation_says_whom_the_final_memories_are_about(tmp_path, tiny_tokenizer):
    """On the shared-names biographies the oracle's final memory names the asked person in
    every episode: results.json's memory summary and the printed line say so per N."""
    from memrl.data.biographies import write_biography_eval

    write_biography_eval(tmp_path / "bio", NUM_DOCS, num_questions=3, seed=1, names="shared")
    diag, printed = run(oracle, tiny_tokenizer, tmp_path / "bio", tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    for n in NUM_DOCS:
        about = {"asked": 3, "namesake": 0, "other": 0, "empty": 0}
        assert diag["per_num_docs"][str(n)]["summary"]["final_memory_about"] == about
        assert results["results"][str(n)]["memory"]["final_memory_about"] == about
    assert "final memory about the asked person / a namesake / other / empty 3 / 0 / 0 / 0" \
        in printed

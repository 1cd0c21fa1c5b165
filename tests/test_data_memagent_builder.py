"""MemAgent's RULER-HQA builder (`--style memagent`), its training parquet and the
closed-book question filter: own paragraphs kept, one permutation per N, golden output,
index lists that render as the string files, parquet read back, one-line errors."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.cli import main
from memrl.data.hotpotqa import load_hotpotqa, load_memagent_parquet, save_memagent_rows
from memrl.data.ruler_hqa import (
    MEMAGENT_SHUFFLE_SEED,
    build_memagent_ruler_hqa,
    load_hotpotqa_pool,
    load_ruler_hqa,
    memagent_doc_indices,
    memagent_pool,
    memagent_training_rows,
    write_memagent_ruler_hqa,
)
from memrl.errors import MemrlInputError
from memrl.eval.closed_book import ClosedBookConfig, reply_answers, select_unanswered
from memrl.inference.scripted import ScriptedGenerator

TITLES = ["Paris", "Lyon", "Nice", "Rome", "Milan", "Oslo", "Bergen", "Turku", "Lagos", "Accra"]


def official_fixture() -> list[dict]:
    """Six HotpotQA-style questions of four paragraphs each; paragraphs are shared between
    neighbouring questions, as in HotpotQA, so the pool is smaller than 6 x 4."""
    items = []
    for q in range(6):
        titles = [TITLES[(q + k) % len(TITLES)] for k in range(4)]
        items.append({
            "_id": f"id{q}", "question": f"Question {q}?", "answer": f"answer {q}",
            "context": [[t, [f"{t} is a city.", f" It has {len(t)} letters."]] for t in titles],
            "supporting_facts": [[titles[0], 0], [titles[1], 1]],
            "type": "bridge", "level": "easy",
        })
    return items


@pytest.fixture
def official(tmp_path):
    path = tmp_path / "hotpot_dev.json"
    path.write_text(json.dumps(official_fixture()))
    return path


def test_pool_is_the_sorted_distinct_paragraphs_and_matches_the_loader(official):
    records = load_hotpotqa(official)
    pool = memagent_pool(records)
    assert pool.docs == sorted(set(pool.docs)) == load_hotpotqa_pool(official)
    assert len(pool.docs) == 9  # titles of questions 0..5 at offsets 0..3: TITLES[0..8]
    assert pool.docs[0] == "Bergen\nBergen is a city. It has 6 letters."
    for record, own in zip(records, pool.own):
        assert [pool.docs[i] for i in own] == [f"{d.title}\n{d.text}" for d in record.documents]


def test_every_question_keeps_all_its_own_paragraphs(official):
    records = load_hotpotqa(official)
    pool = memagent_pool(records)
    for n in (4, 5, 7, 9):
        for q, item in enumerate(build_memagent_ruler_hqa(records, n, index_list=True)):
            assert item["index"] == q and item["num_docs"] == n
            assert len(item["context"]) == n == len(set(item["context"]))
            assert set(pool.own[q]) <= set(item["context"])
    # N = pool size: the whole pool, in the one permutation of that length
    whole = list(range(9))
    random.Random(MEMAGENT_SHUFFLE_SEED).shuffle(whole)
    assert build_memagent_ruler_hqa(records, 9, index_list=True)[3]["context"] == whole


def test_one_permutation_per_n_for_every_question():
    """Own paragraphs come first before the shuffle, and the shuffle is Random(4) for every
    question: the k-th own paragraph lands at the same place in every context of length N."""
    own_a, own_b = [3, 7, 1], [40, 2, 9]
    a = memagent_doc_indices(own_a, 50, 20, index=0)
    b = memagent_doc_indices(own_b, 50, 20, index=1)
    assert [a.index(i) for i in own_a] == [b.index(i) for i in own_b]
    position = list(range(20))
    random.Random(4).shuffle(position)  # position[k]: which pre-shuffle slot lands at k
    assert [position.index(k) for k in range(3)] == [a.index(i) for i in own_a]
    # the random paragraphs avoid the question's own, and are seeded by (seed, index, N)
    assert len(set(a)) == 20 and a == memagent_doc_indices(own_a, 50, 20, index=0)
    assert a != memagent_doc_indices(own_a, 50, 20, index=0, seed=7)


@settings(max_examples=100, deadline=None)
@given(pool_size=st.integers(1, 40), data=st.data())
def test_doc_indices_properties(pool_size, data):
    own = data.draw(st.lists(st.integers(0, pool_size - 1), max_size=min(pool_size, 6)))
    n = data.draw(st.integers(max(1, len(own)), pool_size))
    got = memagent_doc_indices(own, pool_size, n, index=0)
    assert len(got) == (pool_size if n == pool_size else n)
    assert all(0 <= i < pool_size for i in got)
    assert sorted(set(got) - set(own)) == sorted(i for i in set(got) if i not in own)
    for i in own:  # duplicates among own paragraphs are kept, as published
        assert got.count(i) >= own.count(i) or n == pool_size


# Golden values: MemAgent-style files for the fixture with seed 42, shuffle seed 4. A change
# here changes every file users built: bump them only for an intended change of the builder.
GOLDEN_FIRST_CONTEXT_N5 = (
    "Document 1:\nRome\nRome is a city. It has 4 letters.\n\n"
    "Document 2:\nLagos\nLagos is a city. It has 5 letters.\n\n"
    "Document 3:\nParis\nParis is a city. It has 5 letters.\n\n"
    "Document 4:\nNice\nNice is a city. It has 4 letters.\n\n"
    "Document 5:\nLyon\nLyon is a city. It has 4 letters."
)
GOLDEN_SHA256 = {
    5: "f9fea1a31c37f25a6959488cdd829b304b4ef0a0df55aa83a1663b5afd57fdb4",
    9: "3ce4da05fbb8ae2d5e45caa6aea30e5384eb4f532eb04d29ff1fca0bc06589ce",
}


def test_builder_follows_the_published_steps(official):
    """MemAgent's generate_input_output written out step by step (with the per-question rng
    memrl seeds instead of the process-global one): the same context."""
    data = official_fixture()
    docs = sorted({f"{t}\n{''.join(s)}" for item in data for t, s in item["context"]})
    where = {c: i for i, c in enumerate(docs)}
    for q, n in ((0, 5), (2, 7)):
        curr = [where[f"{t}\n{''.join(s)}"] for t, s in data[q]["context"]]
        addition = [i for i in range(len(docs)) if i not in curr]
        all_docs = curr + random.Random(f"memagent:42:{q}:{n}").sample(addition, n - len(curr))
        random.Random(4).shuffle(all_docs)
        context = "\n\n".join(f"Document {i + 1}:\n{docs[d]}" for i, d in enumerate(all_docs))
        records = load_hotpotqa(official)
        assert build_memagent_ruler_hqa(records, n, questions=[q])[0]["context"] == context



def test_golden_output_is_stable(official, tmp_path):
    records = load_hotpotqa(official)
    items = build_memagent_ruler_hqa(records, 5)
    assert items[0]["context"] == GOLDEN_FIRST_CONTEXT_N5
    assert list(items[0]) == ["context", "input", "answers", "num_docs", "index"]
    paths = write_memagent_ruler_hqa(records, tmp_path / "out", [5, 9])
    digests = {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in zip((5, 9), paths)}
    assert digests == GOLDEN_SHA256
    # the same inputs write byte-identical files; other questions do not change question 0
    again = write_memagent_ruler_hqa(records, tmp_path / "again", [5, 9])
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in paths]
    assert build_memagent_ruler_hqa(records, 5, questions=[0, 4])[0] == items[0]


def test_index_list_file_renders_as_the_string_file(official, tmp_path):
    records = load_hotpotqa(official)
    strings = write_memagent_ruler_hqa(records, tmp_path / "s", [5, 9])
    lists = write_memagent_ruler_hqa(records, tmp_path / "l", [5, 9], index_list_from=9)
    assert json.loads(lists[0].read_text()) == json.loads(strings[0].read_text())
    assert isinstance(json.loads(lists[1].read_text())[0]["context"], list)
    from_list = load_ruler_hqa(lists[1], pool=official, expected_num_docs=9)
    from_string = load_ruler_hqa(strings[1], expected_num_docs=9)
    assert from_list == from_string


def test_training_rows_round_trip_through_parquet(official, tmp_path):
    records = load_hotpotqa(official)
    rows = memagent_training_rows(records, 5, questions=[1, 3])
    assert rows[0] == {
        "data_source": "hotpotqa",
        "prompt": [{"role": "user", "content": "Question 1?"}],
        "context": build_memagent_ruler_hqa(records, 5, questions=[1])[0]["context"],
        "ability": "memory",
        "reward_model": {"style": "rule", "ground_truth": ["answer 1"]},
        "extra_info": {"index": 1, "question": "Question 1?", "num_docs": 5},
    }
    path = save_memagent_rows(rows, tmp_path / "train.parquet")
    back = load_memagent_parquet(path)
    assert [(r.id, r.question, r.answers, r.num_docs) for r in back] == [
        ("1", "Question 1?", ["answer 1"], 5), ("3", "Question 3?", ["answer 3"], 5)]
    assert back[0].context == rows[0]["context"]


def test_builder_errors_are_one_line(official):
    records = load_hotpotqa(official)
    with pytest.raises(MemrlInputError, match="larger than the pool of 9"):
        build_memagent_ruler_hqa(records, 10)
    with pytest.raises(MemrlInputError, match="smaller than the 4 paragraphs"):
        build_memagent_ruler_hqa(records, 3)
    with pytest.raises(MemrlInputError, match="out of range"):
        build_memagent_ruler_hqa(records, 5, questions=[6])


# ---------------------------------------------------------------- closed-book filter


@pytest.mark.parametrize(("reply", "expected"), [
    ("\\boxed{Answer 2}", True),            # the boxed reward
    ("I think it is answer 2, maybe.", True),  # the gold answer occurs in the reply
    ("\\boxed{answer2}", True),             # strip_string drops spaces on both sides
    ("\\boxed{answer 3}", False),
    ("", False),
])
def test_reply_answers(reply, expected):
    assert reply_answers(reply, ["answer 2"]) is expected


@settings(max_examples=200, deadline=None)
@given(reply=st.text(max_size=400), gold=st.text(min_size=1, max_size=20))
def test_reply_answers_never_raises(reply, gold):
    assert reply_answers(reply, [gold]) in (True, False)


class Recording(ScriptedGenerator):
    def __init__(self, tokenizer, respond):
        super().__init__(tokenizer, respond)
        self.params, self.prompts = [], []

    def generate(self, prompts, params):
        self.params.append(params)
        self.prompts += [self.tokenizer.decode(p) for p in prompts]
        return super().generate(prompts, params)


def test_filter_keeps_the_first_k_unanswered_in_order(official, tiny_tokenizer):
    records = load_hotpotqa(official)

    def knows(prompt):  # answers questions 0 and 3 (boxed / in words), not the others
        if "Question 0?" in prompt:
            return "\\boxed{answer 0}"
        return "It is Answer 3." if "Question 3?" in prompt else "\\boxed{no idea}"

    gen = Recording(tiny_tokenizer, knows)
    config = ClosedBookConfig(batch_size=2)
    assert select_unanswered([gen], records, 3, config) == [1, 2, 4]
    assert len(gen.prompts) == 2 * 6  # three batches of 2 questions, 2 replies each
    assert "Question 1?\nYour final answer in \\boxed{}.\n" in gen.prompts[2]
    assert {(p.temperature, p.top_p, p.max_new_tokens) for p in gen.params} == {(1.0, 0.7, 512)}
    assert len({p.seed for p in gen.params}) == 3
    # a second model that knows question 1 removes it too; the input running out gives fewer
    other = ScriptedGenerator(tiny_tokenizer, lambda p: "answer 1" if "Question 1?" in p else "")
    assert select_unanswered([gen, other], records, 10, config) == [2, 4, 5]


def cli(capsys, args):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_memagent_style(official, tmp_path, capsys):
    out = tmp_path / "ruler"
    code, stdout, _ = cli(capsys, [
        "prepare", "ruler-hqa", "style=memagent", "-i", str(official), "num_docs=[5,9]",
        "num_questions=4", "index_list_from=9", "--out", str(out)])
    assert code == 0 and "4 questions, pool of 9 paragraphs" in stdout
    assert "index list (evaluate with the ruler-hqa entry's pool" in stdout
    assert len(load_ruler_hqa(out / "eval_9.json", pool=official)) == 4
    code, _, err = cli(capsys, ["prepare", "ruler-hqa", "style=memagent", "-i",
                                str(official), "num_docs=5", "include=all", "--out", str(out)])
    assert code == 2 and err.strip().splitlines() == [
        "error: overrides: include: only with style=memrl (MemAgent keeps all of a question's "
        "own paragraphs)"]
    code, _, err = cli(capsys, ["prepare", "ruler-hqa", "-i", str(official), "num_docs=5",
                                "index_list_from=9", "--out", str(out)])
    assert code == 2 and err.strip().splitlines() == [
        "error: overrides: index_list_from: only with style=memagent"]


def test_cli_index_lists_need_the_official_json(shared_data, tmp_path, capsys):
    code, _, err = cli(capsys, [
        "prepare", "ruler-hqa", "style=memagent", "-i",
        str(shared_data / "hotpotqa" / "dev_subsampled.jsonl"), "num_docs=50",
        "index_list_from=50", "--out", str(tmp_path)])
    assert code == 2 and err.strip().splitlines() == [
        "error: index_list_from: index-list files need the official HotpotQA JSON as "
        "--input (its pool is what a ruler-hqa entry's pool reads back)"]


def test_cli_memagent_parquet_with_a_filter_model(official, tmp_path, capsys, tiny_model_dir):
    """The filter through the in-process HF engine: a tiny random model answers nothing."""
    out = tmp_path / "train.parquet"
    code, stdout, _ = cli(capsys, [
        "prepare", "memagent-parquet", "-i", str(official), "num_docs=6",
        "num_questions=2", f"filter.models=[{tiny_model_dir}]", "filter.samples=1",
        "filter.batch_size=2", "filter.device=cpu", "-o", str(out)])
    assert code == 0, stdout
    assert "2 questions asked, 2 not answered" in stdout
    assert [r.id for r in load_memagent_parquet(out)] == ["0", "1"]

"""Synthetic two-hop questions: deterministic, answerable from exactly the two gold paragraphs."""

from __future__ import annotations

import re

import pytest

from memrl.data.records import render_documents
from memrl.data.ruler_hqa import build_ruler_hqa
from memrl.data.synthetic import (
    COUNTRIES,
    LANGUAGES,
    RIVERS,
    make_synthetic_records,
    synthetic_corpus,
)
from memrl.errors import MemrlInputError


def test_same_seed_same_records_and_different_seed_different_records():
    a = make_synthetic_records(8, num_docs=6, seed=5)
    assert a == make_synthetic_records(8, num_docs=6, seed=5)
    assert [r.model_dump() for r in a] != [r.model_dump() for r in make_synthetic_records(8, 6, 6)]
    assert [r.id for r in a] == [f"syn-5-{i}" for i in range(8)]


@pytest.mark.parametrize("num_docs", [2, 3, 25])
def test_shape_of_each_record(num_docs):
    for r in make_synthetic_records(12, num_docs=num_docs, seed=1):
        assert len(r.documents) == num_docs == r.num_docs
        assert sum(d.is_supporting for d in r.documents) == 2
        assert all(d.is_supporting is not None for d in r.documents)
        assert len({d.title for d in r.documents}) == num_docs
        (answer,) = r.answers
        assert re.fullmatch(r"[A-Z][a-z]+", answer), answer
        assert r.context is None and r.render_context() == render_documents(r.documents)


def test_answer_follows_from_the_two_gold_paragraphs_only():
    records = make_synthetic_records(40, num_docs=12, seed=2)
    for r in records:
        gold = [d for d in r.documents if d.is_supporting]
        others = [d for d in r.documents if not d.is_supporting]
        person_doc = next(d for d in gold if d.title in r.question)  # first hop: named entity
        (bridge_doc,) = [d for d in gold if d is not person_doc]
        assert bridge_doc.title in person_doc.text  # the bridge entity links the hops
        assert r.answers[0] in bridge_doc.text
        assert r.answers[0] not in person_doc.text
        # no distractor mentions the question's entities, so nothing contradicts the gold facts
        for d in others:
            assert person_doc.title not in d.text and bridge_doc.title not in d.text
        if r.question.startswith("In which country"):
            assert r.answers[0] in COUNTRIES
        elif r.question.startswith("On which river"):
            assert r.answers[0] in RIVERS
        elif r.question.startswith("Which language"):
            assert r.answers[0] in LANGUAGES
        else:
            assert r.question.startswith("In which city")
    assert len({r.question[:14] for r in records}) == 4  # all four templates are used


def test_entity_names_are_unique_across_the_data_set():
    records = make_synthetic_records(30, num_docs=10, seed=3)
    titles = [d.title for r in records for d in r.documents]
    assert len(titles) == len(set(titles))
    # so RULER-HQA can mix paragraphs of different questions without contradictions
    items = build_ruler_hqa(records, 40, seed=0)
    assert len(items) == 30 and all(i["context"].count("\nDocument ") == 39 for i in items)


def test_arguments_are_checked():
    with pytest.raises(MemrlInputError, match="num_docs must be an integer of at least 2"):
        make_synthetic_records(3, num_docs=1)
    with pytest.raises(MemrlInputError, match="num_questions must be a positive integer"):
        make_synthetic_records(0)
    with pytest.raises(MemrlInputError, match="n must be non-negative"):
        synthetic_corpus(0, -1)


def test_corpus_is_deterministic_text_in_the_same_vocabulary():
    texts = synthetic_corpus(seed=4, n=6)
    assert texts == synthetic_corpus(seed=4, n=6)
    assert len(texts) == 6 and synthetic_corpus(4, 0) == []
    for text in texts:
        assert text.startswith("Document 1:\n") and "\nQuestion: " in text and "\nAnswer: " in text

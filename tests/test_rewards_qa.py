"""Answer extraction and QA scores against hand-computed values, plus property tests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.rewards import (
    exact_match,
    extract_boxed,
    f1_score,
    normalize_answer,
    qa_scores,
    sub_exact_match,
)

# ---------------------------------------------------------------- extract_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"The answer is \boxed{Paris}.", "Paris"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"first \boxed{A} then \boxed{B}", "B"),
        (r"\boxed{a {b} c}", "a {b} c"),
        (r"\boxed{}", ""),
        (r"\boxed {Paris}", "Paris"),
        (r"\fbox{Rome}", "Rome"),
        (r"\boxed{A} and finally \fbox{B}", "B"),
        (r"\fbox{A} and finally \boxed{B}", "B"),
        (r"so $\boxed 5$.", "5"),
        (r"\boxed 42 is it", "42"),
        (r"set \boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"escaped close \boxed{a\}b}", r"a\}b"),
        ("\\boxed{line one\nline two}", "line one\nline two"),
    ],
)
def test_extract_boxed(text: str, expected: str) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no answer here",
        r"\boxed{unclosed",
        r"\boxed{a{b}",
        r"\boxed{A} then \boxed{unclosed",  # last one is malformed: no fallback
        r"\boxed",
        r"\boxed   ",
        r"\boxed$",
        r"\boxedx{A}",  # not the \boxed control word
        "boxed{A}",
    ],
)
def test_extract_boxed_missing_or_malformed(text: str) -> None:
    assert extract_boxed(text) is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("\\boxedfb{} $x5\n")) | st.characters()))
def test_extract_boxed_never_raises(text: str) -> None:
    out = extract_boxed(text)
    assert out is None or (isinstance(out, str) and out in text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{}\\$"), max_size=30))
def test_extract_boxed_recovers_plain_content(content: str) -> None:
    assert extract_boxed(f"junk \\boxed{{{content}}} tail") == content


# ---------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Cat", "cat"),
        ("  A  man,  a plan!  ", "man plan"),
        ("an apple-pie", "applepie"),
        ("Theater", "theater"),  # articles only as whole words
        ("the", ""),
        ("U.S.A.", "usa"),
        ("tab\tand\nnewline", "tab and newline"),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


# ---------------------------------------------------------------- pairwise scores


def test_exact_match() -> None:
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "eiffel tower") == 0.0


def test_f1_hand_computed() -> None:
    # pred tokens {cat, sat}, gold {cat, sat, down}: P = 1, R = 2/3, F1 = 0.8
    assert f1_score("the cat sat", "cat sat down") == pytest.approx(0.8)
    # pred {paris, france}, gold {paris}: P = 1/2, R = 1, F1 = 2/3
    assert f1_score("Paris, France", "Paris") == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: pred {a, a, b} -> {x x y}; common {x: 1}
    assert f1_score("x x y", "x z") == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert f1_score("dog", "cat") == 0.0


def test_f1_yes_no_special_case() -> None:
    assert f1_score("yes", "yes") == 1.0
    assert f1_score("yes", "no") == 0.0
    # would overlap on "yes" by plain token F1, but HotpotQA gives yes/no no partial credit
    assert f1_score("yes it is", "yes") == 0.0
    assert f1_score("yes", "yes it is") == 0.0
    assert f1_score("noanswer", "no answer") == 0.0


def test_f1_both_empty_is_one() -> None:
    assert f1_score("the", "a") == 1.0
    assert f1_score("", "cat") == 0.0


def test_sub_exact_match() -> None:
    assert sub_exact_match("It is the Eiffel Tower in Paris", "Eiffel Tower") == 1.0
    assert sub_exact_match("Eiffel", "Eiffel Tower") == 0.0
    # substring on normalised strings, as MemAgent's sub_em (not whole words)
    assert sub_exact_match("parisian", "Paris") == 1.0


# ---------------------------------------------------------------- qa_scores


def test_qa_scores_best_over_golds() -> None:
    scores = qa_scores("the cat sat", ["dog", "cat sat down", "a cat"])
    # em: none equal; f1: max(0, 0.8, 2/3); sub_em: "cat" is in "cat sat"
    assert scores == pytest.approx({"em": 0.0, "f1": 0.8, "sub_em": 1.0})
    assert qa_scores("Cat!", ["dog", "the cat"]) == {"em": 1.0, "f1": 1.0, "sub_em": 1.0}


@pytest.mark.parametrize("prediction", [None, "", "   ", "the", "?!"])
def test_qa_scores_empty_prediction_is_zero(prediction: str | None) -> None:
    assert qa_scores(prediction, ["the", "Paris"]) == {"em": 0.0, "f1": 0.0, "sub_em": 0.0}


def test_qa_scores_no_golds_is_zero() -> None:
    assert qa_scores("Paris", []) == {"em": 0.0, "f1": 0.0, "sub_em": 0.0}


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.none(), st.text(max_size=40)),
    st.lists(st.text(max_size=20), min_size=1, max_size=3),
)
def test_qa_scores_properties(prediction: str | None, answers: list[str]) -> None:
    scores = qa_scores(prediction, answers)
    assert set(scores) == {"em", "f1", "sub_em"}
    assert all(0.0 <= v <= 1.0 for v in scores.values())
    assert scores["em"] <= scores["sub_em"]
    if scores["em"] == 1.0:
        assert scores["f1"] == 1.0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.text(max_size=30))
def test_pairwise_properties(prediction: str, gold: str) -> None:
    em, f1, sub = (
        exact_match(prediction, gold),
        f1_score(prediction, gold),
        sub_exact_match(prediction, gold),
    )
    assert 0.0 <= f1 <= 1.0
    assert em <= sub
    if em == 1.0:
        assert f1 == 1.0
    assert f1_score(prediction, gold) == pytest.approx(f1_score(gold, prediction))


def test_boxed_followed_only_by_other_whitespace_is_no_answer():
    """Found by the 1 MB property test: `\\boxed` then a space, then only whitespace that is
    not a space or tab (a newline, \\x0b, \\x1c) used to raise IndexError."""
    for tail in (" \n", " \x0b", "\t\x1c\n "):
        assert extract_boxed("so \\boxed" + tail) is None

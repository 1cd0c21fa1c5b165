"""MemAgent's published RULER-HQA evaluation and training reward (memrl.rewards.memagent).

Every expected value below is what the published MemAgent code returns for that input
(taskutils/memory_eval/ruler_hqa.py + utils/__init__.py for the evaluation,
verl/utils/reward_score/hotpotqa.py for the reward); the cases are our own.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.errors import MemrlInputError
from memrl.rewards.memagent import (
    REWARD_WINDOW,
    exact_match,
    extract_answer_is,
    hotpot_f1,
    last_boxed_content,
    memagent_em,
    memagent_protocol_scores,
    published_means,
    squad_normalize,
    strict_sub_em,
    strip_string,
    sub_em_bidirectional,
)
from memrl.rewards.qa import normalize_answer

# --- answer extraction ----------------------------------------------------------------------

EXTRACT_CASES = [
    # (reply, published prediction)
    ("Therefore, the answer is Paris.", "Paris"),
    ("the answer is A. Later: the answer is B.", "B"),  # the LAST marker wins
    ("The answer is Paris.", None),  # case-sensitive: capitalised marker not found
    ("THE ANSWER IS PARIS", None),
    ("No marker at all", None),
    ("the answer is", ""),  # marker with nothing after: "" (scored 0)
    ("the answer is...", ""),
    ("So the **answer** is **Paris**.", "Paris"),  # every '*' removed first
    ("the answer is \"Paris\".", "\"Paris\""),  # quotes kept (normalisation drops them)
    ("the answer is .Paris. !", "Paris. !"),  # only leading/trailing '.' (then spaces) go
    ("the answer is Paris.<｜end▁of▁sentence｜>", "Paris"),
    ("  \n the answer is  yes \n ", "yes"),
    ("the answer is Rome</think>Hence the answer is Paris", "Paris"),
    ("<think>the answer is Rome</think>I think Paris.", None),  # only after </think> is read
    ("<think>the answer is Rome</think>", "Rome</think>"),  # nothing after: whole reply read
    ("<think>x</think> a </think> the answer is Oslo", "Oslo"),  # after the LAST </think>
    ("the answer isn't clear", "n't clear"),  # plain substring match, as published
    ("", None),
]


@pytest.mark.parametrize(("reply", "expected"), EXTRACT_CASES)
def test_extract_answer_is_matches_published(reply, expected):
    assert extract_answer_is(reply) == expected


# --- scores ---------------------------------------------------------------------------------


def test_squad_normalize_matches_training_side_helper():
    for text in ["The  Big, Apple!", "an apple a day", "Ünïcode — dash", "theater the"]:
        assert squad_normalize(text) == normalize_answer(text)
    assert squad_normalize("The Beatles.") == "beatles"


def test_sub_em_is_bidirectional_and_credits_empty_predictions():
    assert sub_em_bidirectional("It is New York City, USA", "New York City") == 1.0
    assert sub_em_bidirectional("New York", "New York City") == 1.0  # prediction in gold
    assert sub_em_bidirectional("Boston", "New York City") == 0.0
    assert sub_em_bidirectional("the", "New York City") == 1.0  # "" is in every gold (flaw)
    assert sub_em_bidirectional("?!", "Paris") == 1.0
    assert strict_sub_em("New York", "New York City") == 0.0
    assert strict_sub_em("It is New York City, USA", "New York City") == 1.0
    assert strict_sub_em("the", "New York City") == 0.0
    assert exact_match("The Paris!", "paris") == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0


def test_hotpot_f1_official_rules():
    assert hotpot_f1("yes", "no") == (0.0, 0.0, 0.0)
    assert hotpot_f1("yes it is", "yes") == (0.0, 0.0, 0.0)  # gold yes, prediction differs
    assert hotpot_f1("noanswer", "no answer") == (0.0, 0.0, 0.0)
    assert hotpot_f1("yes", "Yes.") == (1.0, 1.0, 1.0)
    assert hotpot_f1("", "") == (0.0, 0.0, 0.0)  # no special case for two empty strings
    f1, precision, recall = hotpot_f1("the New York City", "New York")
    assert (precision, recall) == (2 / 3, 1.0) and f1 == pytest.approx(0.8)
    f1, precision, recall = hotpot_f1("x b b c", "b b b d")  # multiset overlap: 2 tokens
    assert (precision, recall, f1) == (0.5, 0.5, 0.5)


PROTOCOL_CASES = [
    # (reply, answers, published (pred, sub_em, em, f1 rounded to 2 places))
    ("Therefore, the answer is New York.", ["New York City", "NYC"], ("New York", 1.0, 0.0, 0.8)),
    ("Therefore, the answer is NYC.", ["New York City", "NYC"], ("NYC", 0.0, 0.0, 0.0)),
    ("the answer is Charles Darwin", ["Darwin"], ("Charles Darwin", 1.0, 0.0, 0.67)),
    ("the answer is the", ["Paris"], ("the", 1.0, 0.0, 0.0)),  # empty normalised: sub_em 1
    ("the answer is.", ["Paris"], ("", 0.0, 0.0, 0.0)),  # "" prediction: everything 0
    ("I don't know.", ["Paris"], (None, 0.0, 0.0, 0.0)),
    ("the answer is yes", ["Yes"], ("yes", 1.0, 1.0, 1.0)),
    ("the answer is yes, definitely", ["yes"], ("yes, definitely", 1.0, 0.0, 0.0)),
]


@pytest.mark.parametrize(("reply", "answers", "expected"), PROTOCOL_CASES)
def test_protocol_scores_match_published(reply, answers, expected):
    s = memagent_protocol_scores(reply, answers)
    assert (s.prediction, s.sub_em, s.em, s.f1) == expected
    assert s.gold == answers[0]


def test_protocol_uses_answers0_only_and_flags_empty_predictions():
    s = memagent_protocol_scores("Therefore, the answer is NYC.", ["New York City", "NYC"])
    assert s.sub_em == 0.0 and s.strict_sub_em == 0.0  # "NYC" is answers[1]: ignored
    s = memagent_protocol_scores("the answer is an", ["Paris"])
    assert s.sub_em == 1.0 and s.strict_sub_em == 0.0
    assert s.prediction_empty and s.empty_credited
    s = memagent_protocol_scores("no marker", ["Paris"])
    assert s.prediction_empty and not s.empty_credited and s.sub_em == 0.0
    s = memagent_protocol_scores("the answer is Charles Darwin", ["Darwin"])
    assert s.f1 == 0.67 and s.f1_unrounded == pytest.approx(2 / 3)
    assert not s.prediction_empty and s.strict_sub_em == 1.0
    assert s.as_dict()["prediction"] == "Charles Darwin"
    with pytest.raises(MemrlInputError, match="non-empty list of gold answers"):
        memagent_protocol_scores("the answer is x", [])


def test_published_means_drop_empty_replies():
    scores = [memagent_protocol_scores(r, ["Paris"]) for r in
              ["the answer is Paris", "the answer is Rome", "the answer is the", ""]]
    assert scores[-1].dropped_by_published_mean and scores[-1].sub_em == 0.0
    assert published_means(scores) == {"sub_em": 66.67, "em": 33.33, "f1": 33.33}
    assert published_means([]) == {"sub_em": 0.0, "em": 0.0, "f1": 0.0}


# --- training reward ------------------------------------------------------------------------

STRIP_CASES = [
    # (input, published strip_string)
    ("new york city", "newyorkcity"),
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\tfrac12", "\\frac12"),
    ("\\left( x \\right)", "(x)"),
    ("90^{\\circ}", "90"),
    ("\\$5", "5"),
    ("50\\%", "50"),
    ("\\\\\\%%", ""),  # the second "\%" pass matters
    ("5 \\text{ cm}", "5\\text{cm}"),  # \text{} and units are NOT removed
    ("paris.", "paris."),  # trailing period kept
    ("x .5", "x0.5"),
    ("{.5}", "{0.5}"),
    ("a\nb\tc", "ab\tc"),  # newlines removed, tabs kept
    ("a\\!b", "ab"),
]


@pytest.mark.parametrize(("text", "expected"), STRIP_CASES)
def test_strip_string_matches_published(text, expected):
    assert strip_string(text) == expected


BOXED_CASES = [
    # (text, published answer of last_boxed_only_string + remove_boxed)
    ("so \\boxed{paris}", "paris"),
    ("\\boxed{a} then \\boxed{b}", "b"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{a\\}b}", "a\\"),  # a backslash does not escape a brace
    ("\\boxed{open", None),
    ("\\fbox{paris}", None),  # remove_boxed's assertion fails: score 0
    ("\\boxedx{paris}", None),
    ("\\boxed\n{paris}", None),
    ("\\boxed paris is it$ and more", "paris is it"),  # "\boxed " takes the rest up to '$'
    ("\\boxed 3 or \\boxed{4}", "3 or \\boxed{4}"),
    ("\\boxed{4} or \\boxed 3", "3"),
    ("nothing here", None),
]


@pytest.mark.parametrize(("text", "expected"), BOXED_CASES)
def test_last_boxed_content_matches_published(text, expected):
    assert last_boxed_content(text) == expected


REWARD_CASES = [
    # (reply, ground truths, published compute_score)
    ("The answer is \\boxed{New York City}.", ["new york city"], 1.0),
    ("\\boxed{NewYork City}", ["New York city"], 1.0),  # all spaces removed, lowercased
    ("\\boxed{Paris.}", ["Paris"], 0.0),
    ("\\boxed{5 \\text{cm}}", ["5"], 0.0),
    ("\\boxed{\\dfrac{1}{2}}", ["\\frac{1}{2}"], 1.0),
    ("\\boxed{Rome}", ["Paris", "rome"], 1.0),  # best over the ground truths
    ("\\boxed{Rome} \\boxed{Paris}", ["rome"], 0.0),  # only the last box counts
    ("\\fbox{paris}", ["paris"], 0.0),
    ("no box", ["paris"], 0.0),
    ("\\boxed{x}", [], 0.0),
]


@pytest.mark.parametrize(("reply", "truths", "expected"), REWARD_CASES)
def test_memagent_em_matches_published(reply, truths, expected):
    assert memagent_em(reply, truths) == expected


def test_reward_reads_only_the_last_300_characters():
    assert REWARD_WINDOW == 300
    boxed = "\\boxed{paris}"
    assert memagent_em(boxed + "x" * (300 - len(boxed)), ["paris"]) == 1.0  # just inside
    assert memagent_em(boxed + "x" * (301 - len(boxed)), ["paris"]) == 0.0  # '\' cut off
    assert memagent_em(boxed + " " * 400, ["paris"]) == 0.0  # earlier than the window
    # an earlier superseded box outside the window, a later one inside: the later counts
    assert memagent_em("\\boxed{rome}" + "y" * 400 + "\\boxed{paris}", ["paris"]) == 1.0
    # a string form of the ground truth is accepted
    assert memagent_em("\\boxed{Paris}", "paris") == 1.0


# --- robustness -----------------------------------------------------------------------------

_PIECES = st.sampled_from([
    "the answer is", "</think>", "\\boxed{", "\\boxed ", "{", "}", "$", "*", ".", " ", "\n",
    "the", "yes", "Paris", "\\frac", "\\\\", "\\%", "<｜Assistant｜>", "é", "\x00",
])
_TEXT = st.lists(_PIECES | st.text(max_size=8), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(_TEXT, st.lists(_TEXT, min_size=1, max_size=3))
def test_never_raise_on_arbitrary_text(reply, answers):
    s = memagent_protocol_scores(reply, answers)
    assert s.sub_em in (0.0, 1.0) and s.em in (0.0, 1.0) and 0.0 <= s.f1 <= 1.0
    assert s.em <= s.sub_em and s.strict_sub_em <= s.sub_em
    assert memagent_em(reply, answers) in (0.0, 1.0)
    assert isinstance(strip_string(reply), str)
    f1, precision, recall = hotpot_f1(reply, answers[0])
    assert 0.0 <= f1 <= 1.0 and 0.0 <= precision <= 1.0 and 0.0 <= recall <= 1.0


@pytest.mark.parametrize("unit", [
    "the answer is ", "</think>", "\\boxed{", "{", "}", "\\boxed ", "a ", "*", "the the ",
    "\\boxed{{{{", "yes ",
])
def test_100kb_adversarial_inputs_are_fast(unit):
    text = unit * (100_000 // len(unit))
    started = time.perf_counter()
    memagent_protocol_scores(text, [text[:1000] or "x"])
    memagent_em(text, [text])
    last_boxed_content(text)
    strip_string(text)
    assert time.perf_counter() - started < 2.0

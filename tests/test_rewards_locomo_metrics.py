"""LoCoMo metrics as mem0 scores them, and Mem-α's compression term.

Expected values are those of mem0's evaluation/metrics/utils.py (`calculate_metrics` F1) and
nltk's `sentence_bleu(weights=(1, 0, 0, 0), smoothing_function=SmoothingFunction().method1)`
for the same token lists; the cases are our own.
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.errors import MemrlInputError
from memrl.rewards.locomo_metrics import (
    JUDGE_MODEL,
    JUDGE_PROMPT,
    bleu1,
    bleu1_tokens,
    compression_reward,
    judge_prompt,
    parse_judge_label,
    simple_tokenize,
    token_set_f1,
)

# --- token-set F1 ---------------------------------------------------------------------------


def test_simple_tokenize_is_mem0s():
    assert simple_tokenize("Hello, World! Is it 7.5?") == ["hello", "world", "is", "it", "7", "5"]
    assert simple_tokenize("paris; france") == ["paris;", "france"]  # ';' stays attached
    assert simple_tokenize(2022) == ["2022"]


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ("Paris", "paris.", 1.0),
        ("the the the cat", "the cat", 1.0),  # sets: repeats count once
        ("a shell necklace", "A shell necklace from Hawaii", 2 * 1.0 * 0.6 / 1.6),
        ("in May 2023", "7 May 2023", 2 / 3),
        ("Boston", "New York", 0.0),
        ("", "Paris", 0.0),
        ("Paris", "", 0.0),
        ("...", "Paris", 0.0),  # no tokens after tokenising
        (2022, "2022", 1.0),  # mem0 str()-s its inputs
    ],
)
def test_token_set_f1(prediction, reference, expected):
    assert token_set_f1(prediction, reference) == pytest.approx(expected)


# --- BLEU-1 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hypothesis", "reference", "expected"),
    [
        ("the cat sat on the mat", "the cat is on the mat", 5 / 6),  # c == r: no penalty
        ("paris", "paris france", math.exp(1 - 2)),  # brevity penalty exp(1 - r/c)
        ("a a a", "a b", 1 / 3),  # clipped counts; c > r: no penalty
        ("x y", "a b", 0.0),  # no unigram match: 0 (smoothing does not apply)
        ("", "a b", 0.0),
        ("a b", "", 0.0),
        ("b a", "a b c d", math.exp(1 - 4 / 2)),  # order is irrelevant for unigrams
    ],
)
def test_bleu1_hand_values(hypothesis, reference, expected):
    assert bleu1_tokens(hypothesis.split(), reference.split()) == pytest.approx(expected)


def test_bleu1_is_bit_identical_to_nltks_formula():
    # nltk: bp * exp(fsum(w * log(p))) with weights (1, 0, 0, 0)
    assert bleu1_tokens(["a", "b", "c"], ["a", "b", "c", "d", "e"]) == \
        math.exp(1 - 5 / 3) * math.exp(math.log(3 / 3))
    assert bleu1_tokens(list("abcdefg"), list("abxyzqq")) == math.exp(math.log(2 / 7))


def test_bleu1_lowercases_and_takes_a_tokenizer():
    assert bleu1("Paris France", "paris france") == 1.0
    # mem0 uses nltk.word_tokenize, which keeps '.' as a token: hypothesis "paris ." vs
    # reference "paris" has p1 = 1/2 and no brevity penalty (c = 2 > r = 1)
    keep_dot = lambda s: s.replace(".", " .").split()  # noqa: E731
    assert bleu1("Paris.", "Paris", tokenize=keep_dot) == pytest.approx(0.5)
    assert bleu1("Paris.", "Paris") == 1.0  # the default drops '.'


# --- compression term -----------------------------------------------------------------------


def test_compression_reward():
    assert compression_reward(1.0, 100, 1000, 0.5) == pytest.approx(1.45)
    assert compression_reward(0.0, 0, 10, 1.0) == 1.0
    assert compression_reward(0.5, 10, 10, 2.0) == 0.5
    assert compression_reward(1.0, 20, 10, 1.0) == 0.0  # longer memory: negative term
    assert compression_reward(1.0, 50, 100, 0.0) == 1.0
    for bad in (0, -5):
        with pytest.raises(MemrlInputError, match="input_tokens > 0"):
            compression_reward(1.0, 1, bad, 0.1)
    with pytest.raises(MemrlInputError, match="memory_tokens must be >= 0"):
        compression_reward(1.0, -1, 10, 0.1)


# --- LLM judge ------------------------------------------------------------------------------


def test_judge_prompt_is_mem0s_wording():
    assert JUDGE_MODEL == "gpt-4o-mini"
    assert "label an answer to a question as ’CORRECT’ or ’WRONG’" in JUDGE_PROMPT
    assert 'in a json format with the key as "label"' in JUDGE_PROMPT
    filled = judge_prompt("When?", "7 May 2023", "on {the} 7th")
    assert "Question: When?\nGold answer: 7 May 2023\nGenerated answer: on {the} 7th\n" in filled


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"label": "CORRECT"}', "CORRECT"),
        ('{"label": "WRONG"}', "WRONG"),
        ('The answer matches.\n```json\n{"label": "CORRECT"}\n```', "CORRECT"),
        ('```\n{"label": "WRONG"}\n```', "WRONG"),
        ('Reasoning... {"reason": "same date", "label": "CORRECT"} done', "CORRECT"),
        ('{"label": "correct"}', None),  # mem0 compares case-sensitively
        ('{"label": "PARTIAL"}', None),
        ("It refers to the same date. CORRECT", "CORRECT"),  # not JSON: the label word
        ("The generated answer is WRONG.", "WRONG"),
        ("INCORRECT", None),  # whole words only
        ("CORRECT or WRONG", None),  # both present
        ("", None),
        ("{not json", None),
    ],
)
def test_parse_judge_label(text, expected):
    assert parse_judge_label(text) == expected


# --- robustness -----------------------------------------------------------------------------

_TEXT = st.lists(st.sampled_from(["CORRECT", "WRONG", "{", "}", "```", "json", '"label"', ":",
                                  " ", ".", ",", "?", "a", "[", "]"]) | st.text(max_size=6),
                 max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(_TEXT, _TEXT)
def test_never_raise_on_arbitrary_text(a, b):
    assert 0.0 <= token_set_f1(a, b) <= 1.0
    assert 0.0 <= bleu1(a, b) <= 1.0
    assert parse_judge_label(a) in ("CORRECT", "WRONG", None)
    assert judge_prompt(a, b, a).count("Question:") >= 2  # the example + ours


@pytest.mark.parametrize("unit", ["[", "{", "```", "CORRECT ", "a. ", '{"label": ', "x"])
def test_100kb_inputs_are_fast(unit):
    text = unit * (100_000 // len(unit))
    started = time.perf_counter()
    parse_judge_label(text)
    token_set_f1(text, text)
    bleu1(text, text[:500])
    assert time.perf_counter() - started < 2.0

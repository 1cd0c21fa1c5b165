"""Memory-delta reward: hand-computed values for every piece, and the LLM answerer."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.inference.scripted import ScriptedGenerator
from memrl.rewards.memory_delta import (
    answer_prompt,
    contains_tokens,
    efficiency_factor,
    error_rate,
    evidence_recall,
    extract_answer,
    hit_answer_score,
    llm_answer_scores,
    memory_delta_reward,
    retrieval_answer_score,
)


# ---- retrieval answerer ---------------------------------------------------------------


def test_contains_tokens_is_contiguous_and_token_level():
    assert contains_tokens(["on", "7", "may", "2023"], ["7", "may"])
    assert not contains_tokens(["on", "7", "june", "may"], ["7", "may"])  # not contiguous
    assert not contains_tokens(["born", "2017"], ["7"])  # "7" is not inside "2017"
    assert not contains_tokens(["a"], [])
    assert not contains_tokens(["a"], ["a", "b"])


@given(st.lists(st.sampled_from("abc"), max_size=8), st.integers(0, 8), st.integers(0, 8))
def test_contains_tokens_finds_every_slice(hay, i, j):
    needle = hay[min(i, j) : max(i, j)]
    assert contains_tokens(hay, needle) == bool(needle)


def test_hit_answer_score_containment_gives_one():
    hit = "Caroline went to the LGBTQ support group on 7 May 2023."
    assert hit_answer_score(hit, ["7 May 2023"]) == 1.0
    # Articles and punctuation are normalised away on both sides.
    assert hit_answer_score("Eagles fly high", ["The Eagles!"]) == 1.0


def test_hit_answer_score_partial_is_token_f1():
    # hit [melanie, likes, pottery], gold [pottery, and, painting]: 1 common token,
    # precision 1/3, recall 1/3 -> F1 1/3.
    assert hit_answer_score("Melanie likes pottery", ["pottery and painting"]) == pytest.approx(
        1 / 3
    )
    # The best gold answer counts.
    assert hit_answer_score("Melanie likes pottery", ["swimming", "pottery"]) == 1.0


def test_hit_answer_score_edge_cases():
    assert hit_answer_score("born in 2017", ["7"]) == 0.0
    assert hit_answer_score("!!!", ["anything"]) == 0.0  # the hit normalises to nothing
    assert hit_answer_score("some text", ["the", "..."]) == 0.0  # golds normalise to nothing
    assert hit_answer_score("no", ["yes"]) == 0.0  # HotpotQA yes/no rule of f1_score


def test_retrieval_answer_score_is_best_hit():
    hits = ["Melanie likes pottery", "pottery and painting are fun"]
    assert retrieval_answer_score(hits, ["pottery and painting"]) == 1.0
    assert retrieval_answer_score(hits[:1], ["pottery and painting"]) == pytest.approx(1 / 3)
    assert retrieval_answer_score([], ["pottery"]) == 0.0


@settings(max_examples=60)
@given(st.lists(st.text(max_size=40), max_size=4), st.lists(st.text(max_size=20), max_size=3))
def test_retrieval_answer_score_is_total_and_bounded(hits, answers):
    assert 0.0 <= retrieval_answer_score(hits, answers) <= 1.0


def test_evidence_recall():
    evidence = ["I went to the support group yesterday"]
    # hit [caroline, went, to, support, group] vs [i, went, to, support, group, yesterday]:
    # 4 common, P = 4/5, R = 4/6, F1 = 8/11 = 0.727
    hit = "Caroline went to the support group"
    assert evidence_recall([hit], evidence) == 1.0
    assert evidence_recall([hit], evidence, threshold=0.75) == 0.0
    assert evidence_recall(["Bob likes jazz", hit], evidence) == 1.0
    assert evidence_recall([], evidence) == 0.0
    assert evidence_recall([hit], ["..."]) == 0.0
    with pytest.raises(ValueError):
        evidence_recall([hit], evidence, threshold=0.0)


# ---- efficiency, error rate, reward ------------------------------------------------------


def test_efficiency_factor():
    assert efficiency_factor(50, budget=100, scale=100) == 1.0
    assert efficiency_factor(100, budget=100, scale=100) == 1.0
    assert efficiency_factor(200, budget=100, scale=100) == pytest.approx(math.exp(-1))
    assert efficiency_factor(130, budget=100, scale=10) == pytest.approx(math.exp(-3))
    assert efficiency_factor(-30, budget=0, scale=10) == 1.0  # shrinking is never punished
    with pytest.raises(ValueError):
        efficiency_factor(1, budget=-1, scale=1)
    with pytest.raises(ValueError):
        efficiency_factor(1, budget=0, scale=0)


def test_error_rate():
    assert error_rate(1, 4) == 0.25
    assert error_rate(0, 0) == 0.0
    assert error_rate(3, 3) == 1.0
    with pytest.raises(ValueError):
        error_rate(5, 4)


def test_memory_delta_reward_hand_computed():
    # gain scaled by efficiency: (0.7 - 0.2) * 0.5
    assert memory_delta_reward(0.2, 0.7, 0.5, 0.0, 0.1) == pytest.approx(0.25)
    # a loss is not softened by the efficiency factor
    assert memory_delta_reward(0.6, 0.1, 0.5, 0.0, 0.1) == pytest.approx(-0.5)
    # one reply in four malformed: 1.0 - 0.2 * 0.25
    assert memory_delta_reward(0.0, 1.0, 1.0, 0.25, 0.2) == pytest.approx(0.95)
    # garbage: nothing changed, every reply malformed -> exactly -format_penalty
    assert memory_delta_reward(0.3, 0.3, 1.0, 1.0, 0.1) == -0.1
    assert memory_delta_reward(0.3, 0.3, 1.0, 0.0, 0.1) == 0.0


@pytest.mark.parametrize(
    "args", [(0, 1, 1.5, 0, 0.1), (0, 1, 1, 1.5, 0.1), (0, 1, 1, 0, -0.1)]
)
def test_memory_delta_reward_rejects_bad_parts(args):
    with pytest.raises(ValueError):
        memory_delta_reward(*args)


# ---- llm answerer ----------------------------------------------------------------------


def test_answer_prompt_and_extract_answer():
    text = answer_prompt("Where?", ["Alice lives in Oslo.", "Bob likes tea."])
    assert "- Alice lives in Oslo.\n- Bob likes tea." in text
    assert "Question: Where?" in text and "\\boxed{}" in text
    assert "(no memories)" in answer_prompt("Where?", [])
    assert extract_answer("It is \\boxed{ Oslo }.") == "Oslo"
    assert extract_answer("  Oslo\n") == "Oslo"


def test_llm_answer_scores_one_batched_greedy_call(tiny_tokenizer):
    seen = []

    def respond(prompt: str) -> str:
        seen.append(prompt)
        return "\\boxed{Oslo}" if "Oslo" in prompt else "I do not know"

    gen = ScriptedGenerator(tiny_tokenizer, respond)
    out = llm_answer_scores(
        gen,
        ["Where does Alice live?", "Where does Alice live?"],
        [["Alice lives in Oslo."], ["Bob likes tea."]],
        [["Oslo"], ["Oslo"]],
        max_new_tokens=16,
    )
    assert gen.calls == [2]
    assert out[0] == (1.0, "Oslo")
    assert out[1] == (0.0, "I do not know")
    assert all("Where does Alice live?" in p for p in seen)
    assert llm_answer_scores(gen, [], [], []) == []
    with pytest.raises(ValueError):
        llm_answer_scores(gen, ["q"], [], [["a"]])

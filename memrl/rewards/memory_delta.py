"""Memory-delta reward of the MemoryUpdate agent: did its edits make the question answerable?

The agent never sees the question. After it has edited its trial memory, the episode's
question is answered twice by retrieval-augmented QA, once over the *initial* memory (the
base namespace) and once over the *final* memory (the trial namespace), and the reward is
the improvement:

    delta  = score_final - score_initial                     (each score in [0, 1])
    gain   = delta * efficiency(net_added_words)   if delta > 0
           = delta                                 otherwise
    reward = gain - format_penalty * error_rate

* `efficiency` (`efficiency_factor`) is 1 while the memory grew by at most `budget` words
  and decays as exp(-(net - budget) / scale) beyond it, so a gain bought by dumping the whole
  dialogue into memory is worth less than the same gain from a few precise facts. It scales
  gains only: growing the memory never softens a loss (with the plain product, an agent that
  breaks the memory would halve its punishment by also adding junk).
* `error_rate` is the share of the agent's assistant turns that held at least one format
  error (a malformed tool call, or more calls than `max_parallel_calls`). It lies in [0, 1],
  so the penalty is at most `format_penalty` per trajectory whatever its length: an agent
  that emits only malformed calls and changes nothing earns exactly `-format_penalty`.
  A turn without any tool call is not an error: it is how the agent says it is done.

Answerers (the "score" of one memory for one question):
* `retrieval` (default, no model): `retrieval_answer_score` over the top-k memories.
* `llm`: a generator answers from the top-k memories (`llm_answer_scores`); token F1.

Everything here is pure (or, for the LLM answerer, one batched generator call) and total:
model output never raises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memrl.rewards.qa import extract_boxed, f1_score, normalize_answer, qa_scores


def answer_tokens(text: str) -> list[str]:
    """SQuAD-normalised word tokens (lower case, no punctuation or articles)."""
    return normalize_answer(text).split()


def contains_tokens(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    """True when `needle` occurs as a contiguous run of `haystack` (an empty needle: False).

    Token-level, so gold "7" is found in "on 7 May" but not inside "2017".
    """
    # Knuth-Morris-Pratt: linear in len(haystack) + len(needle). Comparing the needle at
    # every position is O(len(haystack) * len(needle)) on runs of one repeated token.
    m = len(needle)
    if m == 0 or m > len(haystack):
        return False
    border = [0] * m  # border[i]: length of the longest proper prefix of needle[: i + 1]
    # that is also a suffix of it
    k = 0
    for i in range(1, m):
        while k and needle[i] != needle[k]:
            k = border[k - 1]
        if needle[i] == needle[k]:
            k += 1
        border[i] = k
    k = 0
    for token in haystack:
        while k and token != needle[k]:
            k = border[k - 1]
        if token == needle[k]:
            k += 1
            if k == m:
                return True
    return False


def hit_answer_score(hit: str, answers: Sequence[str]) -> float:
    """How well one retrieved memory answers: max over gold answers g of
    max(token_f1(hit, g), 1.0 if the normalised tokens of g occur contiguously in the hit).

    Golds that normalise to nothing are ignored; so is an empty hit (score 0).
    """
    hit_tokens = answer_tokens(hit)
    if not hit_tokens:
        return 0.0
    best = 0.0
    for gold in answers:
        gold_tokens = answer_tokens(gold)
        if not gold_tokens:
            continue
        if contains_tokens(hit_tokens, gold_tokens):
            return 1.0
        best = max(best, f1_score(hit, gold))
    return best


def retrieval_answer_score(hits_texts: Sequence[str], answers: Sequence[str]) -> float:
    """The `retrieval` answerer: the best `hit_answer_score` among the retrieved memories
    (the caller passes the top-k texts); 0.0 when nothing was retrieved."""
    return max((hit_answer_score(h, answers) for h in hits_texts), default=0.0)


def evidence_recall(
    hits_texts: Sequence[str], evidence_texts: Sequence[str], threshold: float = 0.5
) -> float:
    """1.0 if some retrieved memory covers some evidence turn, else 0.0.

    A memory covers an evidence turn when their token F1 (SQuAD-normalised words) is at
    least `threshold`: a stored copy or a close paraphrase of the turn counts, a memory that
    shares a few words does not. Evidence turns that normalise to nothing are ignored.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    for ev in evidence_texts:
        if not answer_tokens(ev):
            continue
        for hit in hits_texts:
            if f1_score(hit, ev) >= threshold:
                return 1.0
    return 0.0


def evidence_recall_at_k(
    hits_texts: Sequence[str], evidence: Sequence[Sequence[str]], threshold: float = 0.5
) -> float | None:
    """Evidence recall@k: the share of a question's evidence turns found among the k
    memories retrieved for it (`hits_texts`, the top k).

    Each evidence turn is given by the texts that stand for it (the turn itself and, on
    LoCoMo, the observation facts written from it); a memory holds the turn when its token F1
    (SQuAD-normalised words) with one of them is at least `threshold`: a stored copy or close
    paraphrase of the turn or of its fact counts, a memory sharing a few words does not.
    Turns whose texts all normalise to nothing are not counted; None when no turn is left.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    turns = [[t for t in texts if answer_tokens(t)] for texts in evidence]
    turns = [texts for texts in turns if texts]
    if not turns:
        return None
    found = sum(any(f1_score(hit, t) >= threshold for t in texts for hit in hits_texts)
                for texts in turns)
    return found / len(turns)


def efficiency_factor(net_added_tokens: float, budget: float, scale: float) -> float:
    """1.0 if the memory grew by at most `budget` words, else exp(-(net - budget) / scale).

    `net_added_tokens` is words in the final memory minus words in the initial memory
    (negative when the agent shrank it; that is never punished here).
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if net_added_tokens <= budget:
        return 1.0
    return math.exp(-(net_added_tokens - budget) / scale)


def error_rate(error_turns: int, turns: int) -> float:
    """Share of assistant turns with a format error; 0.0 for a trajectory without turns."""
    if error_turns < 0 or turns < 0 or error_turns > turns:
        raise ValueError(f"need 0 <= error_turns <= turns, got {error_turns} of {turns}")
    return error_turns / turns if turns else 0.0


def memory_delta_reward(
    score_initial: float,
    score_final: float,
    efficiency: float,
    error_rate: float,
    format_penalty: float,
) -> float:
    """(score_final - score_initial) scaled by `efficiency` when positive, minus
    `format_penalty * error_rate` (see the module docstring)."""
    if not 0 <= efficiency <= 1:
        raise ValueError(f"efficiency must be in [0, 1], got {efficiency}")
    if not 0 <= error_rate <= 1:
        raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
    if format_penalty < 0:
        raise ValueError(f"format_penalty must be >= 0, got {format_penalty}")
    delta = score_final - score_initial
    gain = delta * efficiency if delta > 0 else delta
    return gain - format_penalty * error_rate


# ---------------------------------------------------------------------------------------
# the `llm` answerer

ANSWER_TEMPLATE = (
    "Answer the question using only the memories below. Give a short answer (a few words) "
    "and put it in \\boxed{{}}. If the memories do not say, answer \\boxed{{unknown}}.\n\n"
    "Memories:\n{memories}\n\nQuestion: {question}\n\nAnswer:"
)


def answer_prompt(question: str, memories: Sequence[str]) -> str:
    """The LLM answerer's user message: the retrieved memories, then the question."""
    lines = "\n".join(f"- {m}" for m in memories) if memories else "(no memories)"
    return ANSWER_TEMPLATE.format(memories=lines, question=question)


def extract_answer(text: str) -> str:
    """The last \\boxed{} content, else the whole reply without surrounding whitespace."""
    boxed = extract_boxed(text)
    return boxed.strip() if boxed is not None else text.strip()


def llm_answer_scores(
    generator: Any,
    questions: Sequence[str],
    memories: Sequence[Sequence[str]],
    answers: Sequence[Sequence[str]],
    *,
    max_new_tokens: int = 32,
    seed: int | None = None,
) -> list[tuple[float, str]]:
    """The `llm` answerer: (token F1 against the gold answers, predicted answer) per question.

    All prompts go to `generator` in ONE greedy generate call. A reply that normalises to
    nothing scores 0 (qa_scores' rule).
    """
    from memrl.inference.base import SamplingParams, generate_checked, response_text
    from memrl.inference.chat import encode_chat

    if not len(questions) == len(memories) == len(answers):
        raise ValueError(
            f"{len(questions)} questions, {len(memories)} memory lists, {len(answers)} answer lists"
        )
    if not questions:
        return []
    prompts = [
        encode_chat(generator.tokenizer, answer_prompt(q, m))
        for q, m in zip(questions, memories, strict=True)
    ]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=seed)
    generations = generate_checked(generator, prompts, params)
    out = []
    for gen, gold in zip(generations, answers, strict=True):
        prediction = extract_answer(response_text(generator.tokenizer, gen))
        out.append((qa_scores(prediction, gold)["f1"], prediction))
    return out

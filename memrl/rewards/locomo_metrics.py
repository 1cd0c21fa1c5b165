"""LoCoMo scores as mem0 (and, following it, Memory-R1) report them, plus Mem-α's compression
term.

Source of the metrics: mem0's evaluation scripts (github.com/mem0ai/mem0, `evaluation/`,
retired from that repository in commit 9315e3036 "retire in-repo evaluation/ in favor of
mem0ai/memory-benchmarks"; read at its parent):

* `evaluation/metrics/utils.py` (itself borrowed from A-Mem, WujiangXu/AgenticMemory):
  `simple_tokenize`, the token-SET F1 of `calculate_metrics`, and `calculate_bleu_scores`,
  whose `bleu1` is nltk's `sentence_bleu` with weights (1, 0, 0, 0) and
  `SmoothingFunction().method1`, over `nltk.word_tokenize` of the lowercased strings;
* `evaluation/metrics/llm_judge.py`: `ACCURACY_PROMPT` and `evaluate_llm_judge` (gpt-4o-mini,
  temperature 0, JSON mode, `label == "CORRECT"` scores 1);
* `evaluation/evals.py`: category 5 (adversarial) questions are skipped; the BLEU row is
  `calculate_bleu_scores(response, answer)["bleu1"]`, the F1 row `calculate_metrics(...)["f1"]`.

All functions are our own code, pure, and linear in the input length.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

from memrl.errors import MemrlInputError

# ---------------------------------------------------------------------------------------------
# token-set F1


def simple_tokenize(text: object) -> list[str]:
    """mem0's `simple_tokenize`: `str()`, lowercase, `. , ! ?` become spaces, split on
    whitespace. Other punctuation stays attached (`"paris;"` is one token)."""
    lowered = str(text).lower()
    return lowered.translate(_SPACE_PUNCT).split()


_SPACE_PUNCT = str.maketrans({".": " ", ",": " ", "!": " ", "?": " "})


def token_set_f1(prediction: object, reference: object) -> float:
    """The `f1` of mem0's `calculate_metrics`: F1 over token SETS (repeats count once).

    Empty / falsy prediction or reference -> 0.0; both are `str()`-ed and stripped, then
    tokenised with `simple_tokenize`; no token on either side -> 0.0.
    """
    if not prediction or not reference:
        return 0.0
    pred = set(simple_tokenize(str(prediction).strip()))
    ref = set(simple_tokenize(str(reference).strip()))
    if not pred or not ref:
        return 0.0
    common = len(pred & ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


# ---------------------------------------------------------------------------------------------
# BLEU-1

BLEU_SMOOTHING_EPSILON = 0.1
"""nltk `SmoothingFunction(epsilon=0.1).method1`: a zero n-gram precision becomes 0.1 / count.
For BLEU-1 it only touches the 2..4-gram precisions, whose weights are 0, so it never changes
the score: BLEU-1 = brevity penalty * clipped unigram precision, or 0 with no unigram match."""


def bleu1_tokens(hypothesis: Sequence[str], reference: Sequence[str]) -> float:
    """nltk `sentence_bleu([reference], hypothesis, weights=(1, 0, 0, 0),
    smoothing_function=SmoothingFunction().method1)` for one reference, recomputed.

    p1 = sum over hypothesis unigrams of min(count in hypothesis, count in reference) /
    len(hypothesis); 0.0 if no unigram matches (nltk returns 0 before smoothing then).
    Brevity penalty with c = len(hypothesis), r = len(reference): 1 if c > r, else
    exp(1 - r / c). The result is `bp * exp(log(p1))`, as nltk computes it (bit-identical).
    """
    if not hypothesis:
        return 0.0
    ref_counts = Counter(reference)
    matches = sum(min(n, ref_counts[tok]) for tok, n in Counter(hypothesis).items())
    if matches == 0:
        return 0.0
    c, r = len(hypothesis), len(reference)
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return bp * math.exp(math.log(matches / c))


def bleu1(prediction: str, reference: str, *,
          tokenize: Callable[[str], list[str]] | None = None) -> float:
    """BLEU-1 of a prediction against one reference, as mem0's `calculate_bleu_scores`.

    Both strings are lowercased, then tokenised. mem0 tokenises with `nltk.word_tokenize`
    (Punkt + Treebank rules: punctuation becomes its own token, "don't" -> "do", "n't");
    pass `tokenize=nltk.word_tokenize` to reproduce its numbers exactly. The default here
    is `simple_tokenize` (no nltk, no Punkt data download), which drops `. , ! ?` instead of
    keeping them as tokens, so it differs from mem0 whenever the strings hold punctuation.
    """
    split = tokenize or simple_tokenize
    return bleu1_tokens(split(prediction.lower()), split(reference.lower()))


# ---------------------------------------------------------------------------------------------
# Mem-α compression term


def compression_reward(qa_score: float, memory_tokens: int, input_tokens: int,
                       beta: float) -> float:
    """QA score plus Mem-α's compression term: `qa_score + beta * (1 - memory / input)`.

    Mem-α (Wang et al., "Learning Memory Construction via Reinforcement Learning",
    arXiv 2509.25911, github.com/wangyu-ustc/Mem-alpha) rewards short memories with
    r_compression = 1 - l_memory / l_input. Not clipped: a memory longer than its input makes
    the term negative. Raises MemrlInputError if input_tokens <= 0 or memory_tokens < 0.
    """
    if input_tokens <= 0:
        raise MemrlInputError(
            f"compression_reward needs input_tokens > 0 (the length the memory compresses), "
            f"got {input_tokens}"
        )
    if memory_tokens < 0:
        raise MemrlInputError(f"memory_tokens must be >= 0, got {memory_tokens}")
    return qa_score + beta * (1 - memory_tokens / input_tokens)


# ---------------------------------------------------------------------------------------------
# LLM judge

JUDGE_PROMPT = """
Your task is to label an answer to a question as ’CORRECT’ or ’WRONG’. You will be given the following data:
    (1) a question (posed by one user to another user), 
    (2) a ’gold’ (ground truth) answer, 
    (3) a generated answer
which you will score as CORRECT/WRONG.

The point of the question is to ask about something one user should know about the other user based on their prior conversations.
The gold answer will usually be a concise and short answer that includes the referenced topic, for example:
Question: Do you remember what I got the last time I went to Hawaii?
Gold answer: A shell necklace
The generated answer might be much longer, but you should be generous with your grading - as long as it touches on the same topic as the gold answer, it should be counted as CORRECT. 

For time related questions, the gold answer will be a specific date, month, year, etc. The generated answer might be much longer or use relative time references (like "last Tuesday" or "next month"), but you should be generous with your grading - as long as it refers to the same date or time period as the gold answer, it should be counted as CORRECT. Even if the format differs (e.g., "May 7th" vs "7 May"), consider it CORRECT if it's the same date.

Now it's time for the real question:
Question: {question}
Gold answer: {gold_answer}
Generated answer: {generated_answer}

First, provide a short (one sentence) explanation of your reasoning, then finish with CORRECT or WRONG. 
Do NOT include both CORRECT and WRONG in your response, or it will break the evaluation script.

Just return the label CORRECT or WRONG in a json format with the key as "label".
"""  # noqa: E501, W291
"""mem0's `ACCURACY_PROMPT` (evaluation/metrics/llm_judge.py), verbatim: curly quotes
(’CORRECT’), trailing spaces and the leading/trailing newline included, so that judged
numbers are comparable. mem0 sends it as the only user message to gpt-4o-mini at temperature
0 with `response_format={"type": "json_object"}`."""

JUDGE_MODEL = "gpt-4o-mini"


def judge_prompt(question: str, gold_answer: str, generated_answer: str) -> str:
    """The judge prompt filled in (`ACCURACY_PROMPT.format(...)` in mem0; mem0 passes the
    gold through `str()`, so an integer year reads as e.g. `2022`)."""
    return JUDGE_PROMPT.format(question=question, gold_answer=gold_answer,
                               generated_answer=generated_answer)


JudgeLabel = Literal["CORRECT", "WRONG"]
_LABEL_WORD = re.compile(r"\b(CORRECT|WRONG)\b")  # two literals: linear, no backtracking


def _json_candidate(text: str) -> str:
    """The JSON text mem0's `extract_json` (mem0/memory/utils.py) would hand to json.loads:
    the first ``` fenced block (minus an optional `json` tag), else first `{` .. last `}`,
    else the text. Written with find/rfind instead of its lazy DOTALL regex (linear)."""
    text = text.strip()
    open_at = text.find("```")
    if open_at >= 0:
        close_at = text.find("```", open_at + 3)
        if close_at >= 0:
            inner = text[open_at + 3:close_at]
            if inner.startswith("json"):
                inner = inner[4:]
            return inner.strip()
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        return text[start:end + 1]
    return text


def parse_judge_label(text: str) -> JudgeLabel | None:
    """The judge's verdict, or None when it cannot be read.

    1. As mem0: parse the JSON object (see `_json_candidate`) and read its `"label"`; exactly
       "CORRECT" or "WRONG" (case-sensitive, as mem0 compares `label == "CORRECT"`) is the
       verdict; any other label -> None (mem0 would score it 0).
    2. Not JSON (mem0 would crash): the whole words CORRECT / WRONG in upper case; exactly
       one of the two kinds present -> that label; both (forbidden by the prompt) or
       neither -> None.
    Callers that need mem0's 0/1 use `1 if label == "CORRECT" else 0`.
    """
    candidate = _json_candidate(text)
    try:
        data = json.loads(candidate)
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict) and "label" in data:
        label = data["label"]
        return label if label in ("CORRECT", "WRONG") else None
    kinds = {m.group(1) for m in _LABEL_WORD.finditer(text)}
    if kinds == {"CORRECT"}:
        return "CORRECT"
    if kinds == {"WRONG"}:
        return "WRONG"
    return None

"""MemAgent's published evaluation and training reward, reproduced exactly (issue 12).

Two different scorers ship with MemAgent (github.com/BytedTsinghua-SIA/MemAgent):

* The **evaluation** of RULER-HQA (`taskutils/memory_eval/ruler_hqa.py`, `get_pred`, with the
  helpers in `taskutils/memory_eval/utils/__init__.py`). The MemAgent models are run with
  `--api recurrent` (`taskutils/memory_eval/run.py`), whose final prompt
  (`utils/recurrent.py`, `TEMPLATE_FINAL`) asks for "Therefore, the answer is ...". The reply
  is reduced to a prediction by `extract_solution` + `extract_answer` (here:
  `extract_answer_is`) and scored against `answers[0]` only with SQuAD-normalised EM, a
  *bidirectional* sub-EM and HotpotQA F1 (`calc_metrics` / `update_answer`).
* The **training reward** (`verl/utils/reward_score/hotpotqa.py`, `compute_score`): the last
  `\\boxed{}` in the last 300 characters of the reply, compared with each ground truth after
  the MATH-style `strip_string` (here: `memagent_em`).

Everything is our own code, written from a reading of those functions; the comments name the
published function each piece mirrors. All functions are pure, total on arbitrary model
output (they never raise on a reply) and linear in its length: no backtracking regex ever
runs on model output, only `str.find`/`rfind`/`replace` and single passes.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from memrl.errors import MemrlInputError
from memrl.rewards.qa import closing_brace

# ---------------------------------------------------------------------------------------------
# extraction (evaluation)

THINK_END = "</think>"
ANSWER_MARKER = "the answer is"
"""Matched case-sensitively, as published: "The answer is" is *not* found (the prompt asks
for "Therefore, the answer is", which is)."""

_CHAT_TOKENS = ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")
"""DeepSeek-R1 special tokens that `extract_answer` deletes from the answer."""


def after_think(reply: str) -> str:
    """What follows the last `</think>`, stripped; the whole reply when there is none.

    Mirrors `extract_solution` (taskutils/memory_eval/utils/__init__.py) with the environment
    variable FORCE_THINK unset (its default; with it set a reply without `</think>` scores 0).
    """
    cut = reply.rfind(THINK_END)
    if cut < 0:
        return reply
    return reply[cut + len(THINK_END):].strip()


def _answer_after_marker(text: str) -> str | None:
    """`extract_answer` (taskutils/memory_eval/utils/__init__.py), step by step."""
    text = text.replace("*", "")  # every '*' goes first, so "the **answer** is" matches
    at = text.rfind(ANSWER_MARKER)
    if at < 0:
        return None
    answer = text[at + len(ANSWER_MARKER):].strip()
    for token in _CHAT_TOKENS:
        answer = answer.replace(token, "")
    # leading and trailing periods go, nothing else: quotes, commas, ')' and '!' stay
    return answer.strip().strip(".").strip()


def extract_answer_is(reply: str) -> str | None:
    """The prediction the published RULER-HQA evaluation extracts from a final reply.

    Source: `get_pred` in taskutils/memory_eval/ruler_hqa.py, i.e.
    `pred = extract_answer(p) if p else extract_answer(response)` where
    `response = reply.strip()` and `p = extract_solution(response)[0]`:

    1. cut the reply after the last `</think>` and strip it (no `</think>`: the whole reply);
       if nothing follows `</think>`, fall back to the *whole* reply, think block included;
    2. delete every `*` (markdown bold cannot hide the marker);
    3. take the text after the LAST case-sensitive `the answer is`, strip whitespace, delete
       the DeepSeek chat tokens, strip whitespace, then leading/trailing `.`, then whitespace.

    Returns None when the marker is absent (as published). It may return "" (e.g.
    "the answer is."): the published script treats "" like None (every score 0), and so does
    `memagent_protocol_scores`. Quotes, brackets and other punctuation are kept here; the
    SQuAD normalisation of the scorers removes them.
    """
    response = reply.strip()
    tail = after_think(response)
    return _answer_after_marker(tail if tail else response)


# ---------------------------------------------------------------------------------------------
# scores (evaluation)

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")  # fixed alternatives, no nested quantifier: linear
_YES_NO = frozenset({"yes", "no", "noanswer"})


def squad_normalize(text: str) -> str:
    """SQuAD / HotpotQA `normalize_answer`: lower, drop ASCII punctuation, drop articles,
    collapse whitespace (in that order).

    Pinned here (same semantics as memrl.rewards.qa.normalize_answer) so that the protocol
    numbers cannot move when the training-side helpers change.
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """`exact_match_score`: normalised strings equal (1.0) or not (0.0)."""
    return float(squad_normalize(prediction) == squad_normalize(gold))


def sub_em_bidirectional(prediction: str, gold: str) -> float:
    """MemAgent's published `sub_em` (`sub_exact_match_score`, memory_eval/utils/__init__.py).

    1.0 if the normalised gold occurs in the normalised prediction OR the normalised
    prediction occurs in the normalised gold. Known flaw, kept because it is the published
    metric: a prediction that normalises to "" (e.g. "the", "?!") is a substring of every
    gold and scores 1.0; so does any fragment of the gold ("New" for "New York City").
    Use `strict_sub_em` for the one-way score.
    """
    norm_pred, norm_gold = squad_normalize(prediction), squad_normalize(gold)
    return float(norm_gold in norm_pred or norm_pred in norm_gold)


def strict_sub_em(prediction: str, gold: str) -> float:
    """One-way sub-EM: the normalised gold occurs in a non-empty normalised prediction.

    Not a published MemAgent metric; reported beside `sub_em_bidirectional` so that its
    empty-prediction and fragment credit can be seen.
    """
    norm_pred = squad_normalize(prediction)
    return float(bool(norm_pred) and squad_normalize(gold) in norm_pred)


class F1(NamedTuple):
    f1: float
    precision: float
    recall: float


def hotpot_f1(prediction: str, gold: str) -> F1:
    """HotpotQA token F1, exactly as `f1_score` of the official `hotpot_evaluate_v1.py`
    (copied unchanged into MemAgent's taskutils/memory_eval/utils/__init__.py).

    If either normalised side is yes / no / noanswer and they differ: (0, 0, 0). No common
    token (including both sides empty): (0, 0, 0). Unlike memrl.rewards.qa.f1_score there is
    no special case for two empty strings.
    """
    norm_pred, norm_gold = squad_normalize(prediction), squad_normalize(gold)
    if (norm_pred in _YES_NO or norm_gold in _YES_NO) and norm_pred != norm_gold:
        return F1(0.0, 0.0, 0.0)
    pred_tokens, gold_tokens = norm_pred.split(), norm_gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return F1(0.0, 0.0, 0.0)
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return F1(2 * precision * recall / (precision + recall), precision, recall)


@dataclass(frozen=True)
class ProtocolScores:
    """One reply scored as MemAgent's RULER-HQA evaluation does, plus strict companions."""

    prediction: str | None
    """`extract_answer_is(reply)`; None when `the answer is` is absent."""
    gold: str
    """answers[0]: the published script ignores the other answers."""
    sub_em: float
    """Published headline metric (bidirectional, see `sub_em_bidirectional`)."""
    em: float
    f1: float
    """Published per-item F1: `calc_metrics` rounds each item's F1 to 2 decimals."""
    f1_unrounded: float
    strict_sub_em: float
    prediction_empty: bool
    """No prediction, or one that normalises to "" (nothing an answer could be judged on)."""
    empty_credited: bool
    """The published sub_em is 1 only because the non-empty prediction normalises to ""."""
    dropped_by_published_mean: bool
    """The reply is exactly "": `get_pred` skips such items (a failed request) entirely, so
    they are missing from its averages rather than scored 0. Here they score 0."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def memagent_protocol_scores(reply: str, answers: Sequence[str]) -> ProtocolScores:
    """Score one final reply like `get_pred` in MemAgent's taskutils/memory_eval/ruler_hqa.py.

    Only `answers[0]` is used, as published. The scores are computed only when the
    prediction is truthy (neither None nor ""); otherwise em = sub_em = f1 = 0.
    Raises MemrlInputError when `answers` is empty (a data error, not a model error).
    """
    if isinstance(answers, str) or not answers:
        raise MemrlInputError("a RULER-HQA record needs a non-empty list of gold answers")
    gold = answers[0]
    prediction = extract_answer_is(reply)
    norm_empty = prediction is None or not squad_normalize(prediction)
    if prediction:
        f1 = hotpot_f1(prediction, gold).f1
        sub = sub_em_bidirectional(prediction, gold)
        scores = dict(sub_em=sub, em=exact_match(prediction, gold), f1=round(f1, 2),
                      f1_unrounded=f1, strict_sub_em=strict_sub_em(prediction, gold))
    else:
        sub = 0.0
        scores = dict(sub_em=0.0, em=0.0, f1=0.0, f1_unrounded=0.0, strict_sub_em=0.0)
    return ProtocolScores(
        prediction=prediction,
        gold=gold,
        **scores,
        prediction_empty=norm_empty,
        empty_credited=bool(prediction) and norm_empty and sub == 1.0,
        dropped_by_published_mean=reply == "",
    )


PUBLISHED_METRICS = ("sub_em", "em", "f1")


def published_means(scores: Iterable[ProtocolScores]) -> dict[str, float]:
    """The percentages `get_pred` prints: `round(sum(v) * 100 / len(v), 2)` per metric, over
    the items it keeps (replies that are exactly "" are dropped). Empty input: all 0.0.
    """
    kept = [s for s in scores if not s.dropped_by_published_mean]
    if not kept:
        return {m: 0.0 for m in PUBLISHED_METRICS}
    return {m: round(sum(getattr(s, m) for s in kept) * 100 / len(kept), 2)
            for m in PUBLISHED_METRICS}


# ---------------------------------------------------------------------------------------------
# training reward (verl/utils/reward_score/hotpotqa.py)

REWARD_WINDOW = 300
"""`compute_score` only looks at the last 300 characters of the reply."""

_BOXED = "\\boxed"
_BOXED_SPACE = "\\boxed "
_BOXED_BRACE = "\\boxed{"


def last_boxed_content(text: str) -> str | None:
    """The answer `last_boxed_only_string` + `remove_boxed` (hotpotqa.py) take, or None.

    Their exact behaviour, including the quirks:
    * if `\\boxed ` (with a space) occurs anywhere, the answer is everything after its LAST
      occurrence up to the first `$` (or the end), spaces and newlines included;
    * else the last `\\boxed` must be followed directly by `{`; the answer is the content
      up to the brace that closes it, counting every `{`/`}` (a backslash does not escape);
      unbalanced -> None;
    * `\\fbox{..}`, `\\boxedx{..}`, `\\boxed\\n{..}` make `remove_boxed`'s assertion fail,
      which `compute_score` catches: None here (score 0).
    """
    space = text.rfind(_BOXED_SPACE)
    if space >= 0:
        rest = text[space + len(_BOXED_SPACE):]
        dollar = rest.find("$")
        return rest if dollar < 0 else rest[:dollar]
    at = text.rfind(_BOXED)
    if at < 0 or not text.startswith(_BOXED_BRACE, at):
        return None
    start = at + len(_BOXED_BRACE) - 1
    end = closing_brace(text, start, escapes=False)
    return None if end is None else text[start + 1 : end]


_STRIP_STEPS: tuple[tuple[str, str], ...] = (
    ("\n", ""),
    ("\\!", ""),
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
    # the published code removes "\%" twice (the second spelled "\%" with a W605 noqa); the
    # second pass is not a no-op: "\\\%%" becomes "\\%%" -> "\%" -> ""
    ("\\%", ""),
    ("\\%", ""),
    (" .", " 0."),
    ("{.", "{0."),
    (" ", ""),
)


def strip_string(text: str) -> str:
    """`strip_string` of MemAgent's verl/utils/reward_score/hotpotqa.py.

    That is a *reduced* MATH normalisation: an ordered list of plain replacements (drop
    newlines and `\\!`, `\\\\` -> `\\`, tfrac/dfrac -> frac, drop `\\left`/`\\right`, degree
    marks, `\\$`, `\\%` (twice), " ." -> " 0.", "{." -> "{0.", then drop every space).
    Unlike the full Hendrycks version it does NOT remove `\\text{...}` or units, does not fix
    `\\frac12` / `\\sqrt2` / `0.5`, and does not drop a trailing period. Tabs are kept.
    """
    for old, new in _STRIP_STEPS:
        text = text.replace(old, new)
    return text


def memagent_em(reply: str, ground_truths: Sequence[str]) -> float:
    """MemAgent's training reward: `compute_score` in verl/utils/reward_score/hotpotqa.py.

    The last 300 characters of the reply (sliced *before* lowercasing), lowercased; the
    answer of `last_boxed_content` in them (a `\\boxed{}` that starts earlier is not seen,
    nor is one cut by the window's start); 1.0 if `strip_string(answer)` equals
    `strip_string(truth.lower())` for any ground truth, else 0.0. No answer, or no ground
    truths, gives 0.0 (the published code would raise on an empty list).
    """
    if isinstance(ground_truths, str):
        ground_truths = [ground_truths]
    answer = last_boxed_content(reply[-REWARD_WINDOW:].lower())
    if answer is None:
        return 0.0
    mine = strip_string(answer)
    return float(any(mine == strip_string(truth.lower()) for truth in ground_truths))

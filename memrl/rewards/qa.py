"""Answer extraction and QA scores, as the MemAgent / HotpotQA evaluations compute them.

- `normalize_answer` is the SQuAD normalisation (lower, drop punctuation, drop articles,
  collapse whitespace) used by the official HotpotQA script.
- `f1_score` is HotpotQA's token F1, including its special case: when either side is
  yes / no / noanswer and they differ, F1 is 0 (a "yes" never earns partial credit).
- `sub_exact_match` is MemAgent's `sub_em`: the normalised gold is a substring of the
  normalised prediction.

Everything here is pure and total: model output never raises, it only scores low.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
"""`\\boxed` or its alias `\\fbox`, as a whole control word (not `\\boxedx`)."""

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = frozenset({"yes", "no", "noanswer"})


def closing_brace(text: str, open_at: int, *, escapes: bool = True) -> int | None:
    """Index of the `}` that closes the `{` at `open_at` (braces balanced), None if none.

    With `escapes`, a backslash escapes the next character (`\\{` does not count);
    without, every brace counts (MATH's `last_boxed_only_string`). One pass: linear.
    """
    depth, k, n = 0, open_at, len(text)
    while k < n:
        ch = text[k]
        if escapes and ch == "\\":
            k += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return k
        k += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent.

    `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`; backslash-escaped braces (`\\{`) do not
    count towards the balance. `\\boxed 5` (no braces) gives the next whitespace-free token,
    without a trailing `$`. If the last occurrence is malformed (unbalanced, or nothing
    follows it), the answer is None: we never fall back to an earlier, superseded answer.
    """
    # Linear: one regex pass (literals and a one-character lookahead, nothing to backtrack)
    # keeps only the last match, then one brace scan from it; earlier ones are never rescanned.
    last: re.Match[str] | None = None
    for last in _BOXED.finditer(text):
        pass
    if last is None:
        return None
    i = last.end()
    n = len(text)
    j = i
    while j < n and text[j] in " \t":
        j += 1
    if j >= n:
        return None
    if text[j] == "{":
        end = closing_brace(text, j)
        return None if end is None else text[j + 1 : end]
    if j == i:
        # `\boxed` directly followed by a non-letter that is not a brace or a space,
        # e.g. `\boxed$`: no argument.
        return None
    rest = text[j:].split(maxsplit=1)
    if not rest:  # only whitespace that is not " " or "\t" follows, e.g. "\\boxed \x0b"
        return None
    token = rest[0].split("$", 1)[0]
    return token or None


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower, remove punctuation, remove articles, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def sub_exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalised gold occurs in the normalised prediction (MemAgent's sub_em)."""
    return float(normalize_answer(gold) in normalize_answer(prediction))


def f1_score(prediction: str, gold: str) -> float:
    """HotpotQA token F1 over normalised tokens.

    Deviation from the official script, for one degenerate case only: when *both* sides
    normalise to nothing, F1 is 1.0 (SQuAD v2 convention) instead of 0.0, so that an exact
    match always has F1 = 1.
    """
    norm_pred = normalize_answer(prediction)
    norm_gold = normalize_answer(gold)
    if (norm_pred in _YES_NO or norm_gold in _YES_NO) and norm_pred != norm_gold:
        return 0.0
    pred_tokens = norm_pred.split()
    gold_tokens = norm_gold.split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_scores(prediction: str | None, answers: Sequence[str]) -> dict[str, float]:
    """`em`, `f1`, `sub_em` of a prediction: each the best over the gold answers.

    A missing prediction (None, e.g. no `\\boxed{}` found) or one that normalises to
    nothing (empty, only punctuation or articles) scores 0 on every metric: an empty
    answer must never be rewarded, even against a degenerate gold.
    """
    zero = {"em": 0.0, "f1": 0.0, "sub_em": 0.0}
    if prediction is None or not normalize_answer(prediction) or not answers:
        return zero
    return {
        "em": max(exact_match(prediction, g) for g in answers),
        "f1": max(f1_score(prediction, g) for g in answers),
        "sub_em": max(sub_exact_match(prediction, g) for g in answers),
    }

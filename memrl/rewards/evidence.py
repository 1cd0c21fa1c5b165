"""Is the gold content in a text? The checks behind the memory diagnostics of MemAgent.

- `answer_in_text`: a gold answer occurs in the text as whole words, both normalised as the
  QA scores normalise them (`normalize_answer`: lower case, no punctuation, no articles).
  None when no answer can be looked for: yes / no questions (their answer is not a span of
  the context) and answers that normalise to nothing.
- `fact_in_text`: a supporting fact's key content is in the text: every *key word* of the
  fact (a word written with a capital letter or a digit: names, dates, numbers; articles
  dropped) is a word of the normalised text, in any order, so a memory that rephrases
  "Kovan was born in Zarnia." as "Kovan: born Zarnia" still holds it. A fact with no such
  word needs all of its words.
- `locate_evidence`: where the gold evidence enters a chunked context: the chunk in which
  each supporting fact is first complete in the text read so far (its exact sentence, as
  `memrl.agents.oracle` decides what it has seen), and the chunk in which a gold answer
  first appears (whole words, normalised; an answer cut by a chunk boundary is found in
  the later chunk).

Everything is linear in the length of its inputs and total: model output never raises.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memrl.rewards.qa import normalize_answer

_NOT_SPANS = frozenset({"yes", "no", "noanswer"})


def _searchable(answers: Sequence[str]) -> list[str]:
    """The normalised answers that can be looked for in a text."""
    out = []
    for a in answers:
        norm = normalize_answer(a)
        if norm and norm not in _NOT_SPANS:
            out.append(norm)
    return list(dict.fromkeys(out))


def _has_words(normalised_text: str, needles: Sequence[str]) -> bool:
    padded = f" {normalised_text} "
    return any(f" {n} " in padded for n in needles)


def key_words(fact: str) -> frozenset[str]:
    """The normalised words of `fact` written with a capital letter or a digit (articles
    dropped), or all of its normalised words when it has none."""
    keys: set[str] = set()
    for word in fact.split():
        stripped = word.lstrip("\"'([{")
        if stripped[:1].isupper() or stripped[:1].isdigit():
            keys.update(normalize_answer(word).split())
    return frozenset(keys or normalize_answer(fact).split())


@dataclass(frozen=True)
class GoldContent:
    """What to look for in a text, prepared once per question: the searchable normalised
    answers and the key words of each supporting fact (`check` normalises a text once)."""

    answers: tuple[str, ...]
    facts: tuple[frozenset[str], ...]

    @classmethod
    def of(cls, answers: Sequence[str], facts: Sequence[str] = ()) -> GoldContent:
        return cls(tuple(_searchable(answers)), tuple(key_words(f) for f in facts))

    def check(self, text: str) -> tuple[bool | None, float | None]:
        """(a gold answer is in `text` — None when none can be looked for; the fraction of
        the facts whose key words are all words of `text` — None when there are none)."""
        if not self.answers and not self.facts:
            return None, None
        norm = normalize_answer(text)
        answer = _has_words(norm, self.answers) if self.answers else None
        if not self.facts:
            return answer, None
        words = set(norm.split())
        return answer, sum(keys <= words for keys in self.facts) / len(self.facts)


def answer_in_text(text: str, answers: Sequence[str]) -> bool | None:
    """Whether a gold answer occurs in `text` as whole words (both normalised); None when
    no answer can be looked for (yes / no, or empty after normalisation)."""
    return GoldContent.of(answers).check(text)[0]


def fact_in_text(text: str, fact: str) -> bool:
    """Whether every key word of `fact` (`key_words`) is a word of the normalised `text`."""
    return GoldContent.of((), [fact]).check(text)[1] == 1.0


def facts_in_text(text: str, facts: Sequence[str]) -> float | None:
    """The fraction of `facts` whose key content is in `text`; None when there are none."""
    return GoldContent.of((), facts).check(text)[1]


def locate_evidence(chunks: Sequence[str], answers: Sequence[str],
                    facts: Sequence[str] = ()) -> dict[str, Any]:
    """Where the evidence enters a context read chunk by chunk (chunk indices are 0-based):

        {"answer_chunk": first chunk where a gold answer appears, or None,
         "facts": the facts, "fact_chunks": per fact the chunk completing its first
         occurrence, or None when the text never holds it}

    `answer_chunk` is None also when no answer can be looked for (`answer_in_text`)."""
    ends, total = [], 0
    for chunk in chunks:
        total += len(chunk)
        ends.append(total)
    full = "".join(chunks)
    fact_chunks: list[int | None] = []
    for fact in facts:
        at = full.find(fact) if fact else -1
        fact_chunks.append(None if at < 0 else bisect_left(ends, at + len(fact)))

    needles = _searchable(answers)
    answer_chunk = None
    if needles:
        # A window around each boundary finds an answer the boundary cuts; it spans enough
        # characters of each side for the longest answer written with punctuation in it.
        width = 2 * max(len(a) for a in answers) + 16
        for k, chunk in enumerate(chunks):
            straddle = k > 0 and _has_words(
                normalize_answer(chunks[k - 1][-width:] + chunk[:width]), needles)
            if straddle or _has_words(normalize_answer(chunk), needles):
                answer_chunk = k
                break
    return {"answer_chunk": answer_chunk, "facts": list(facts), "fact_chunks": fact_chunks}


def evidence_chunk(evidence: Any) -> int | None:
    """The chunk after which all the gold evidence has been read: the last of the facts'
    chunks when the record knows its facts (None if one never appears), else the chunk where
    the answer first appears; None also for a missing or malformed `evidence` (as
    `locate_evidence` writes it)."""
    if not isinstance(evidence, dict):
        return None
    facts = evidence.get("facts")
    chunks = evidence.get("fact_chunks") if facts else [evidence.get("answer_chunk")]
    if facts and (not isinstance(chunks, list) or len(chunks) != len(facts)):
        return None
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in chunks):
        return None
    return max(chunks)

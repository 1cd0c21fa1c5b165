"""memrl's RULER-HQA builder: HotpotQA questions hidden among N paragraphs, written in
MemAgent's `eval_{N}.json` format.

A file is a JSON list of `{"index", "input", "answers", "context", "num_docs"}`. For each
question the context holds its gold paragraphs plus distractors drawn from *other* questions'
paragraphs, shuffled and rendered as `Document {i}:\\n{title}\\n{text}` (as RULER's qa task).

Determinism: every random choice is seeded by (seed, question index) only, never by shared
state, so the same inputs give byte-identical files and the files for different N do not
depend on each other. The distractors are drawn as a prefix of one fixed random permutation
per question, so the distractors of a smaller N are a subset of those of a larger N.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from memrl.data.io import write_json_atomic
from memrl.data.records import Document, QARecord, render_documents, supporting_facts
from memrl.errors import MemrlInputError

INCLUDE_MODES = ("gold", "all")
"""`gold`: gold paragraphs + distractors from other questions. `all`: also the question's own
non-gold paragraphs first (RULER's `more_context`), then other questions' paragraphs."""

FILE_TEMPLATE = "eval_{num_docs}.json"


def ruler_hqa_path(out_dir: str | Path, num_docs: int) -> Path:
    """Where the file for N documents lives: `OUT/eval_{N}.json`."""
    return Path(out_dir) / FILE_TEMPLATE.format(num_docs=num_docs)


def _key(doc: Document) -> tuple[str, str]:
    return (doc.title, doc.text)


def _rng(seed: int, *parts: object) -> random.Random:
    # A string seed is hashed with SHA-512 by `random`: stable across runs and PYTHONHASHSEED.
    return random.Random(":".join(["ruler-hqa", str(seed), *map(str, parts)]))


def _lazy_permutation(n: int, rng: random.Random) -> Iterator[int]:
    """A uniformly random permutation of range(n), produced lazily (sparse Fisher-Yates).

    Taking k elements costs O(k), and the first k are the same whatever k is.
    """
    moved: dict[int, int] = {}
    for i in range(n):
        j = rng.randrange(i, n)
        vi, vj = moved.get(i, i), moved.get(j, j)
        moved[j] = vi
        yield vj


@dataclass(frozen=True)
class _Plan:
    """What one question contributes: paragraphs that must appear, own extras, exclusions."""

    record: QARecord
    required: list[Document]
    own_extra: list[Document]
    excluded_titles: frozenset[str]
    excluded_keys: frozenset[tuple[str, str]]


def _dedupe(documents: Sequence[Document]) -> list[Document]:
    seen: set[tuple[str, str]] = set()
    out = []
    for d in documents:
        if _key(d) not in seen:
            seen.add(_key(d))
            out.append(Document(title=d.title, text=d.text))
    return out


def _plan(record: QARecord, include: str) -> _Plan:
    docs = record.documents
    if not docs:
        raise MemrlInputError(
            f"question '{record.id}' has no paragraphs (a ready-made context string cannot be "
            "rebuilt into RULER-HQA)"
        )
    flagged = all(d.is_supporting is not None for d in docs) and any(d.is_supporting for d in docs)
    if include == "gold" and not flagged:
        raise MemrlInputError(
            f"question '{record.id}' has no supporting-paragraph flags, so its gold paragraphs "
            "are unknown; use include='all' (`memrl prepare ruler-hqa ... include=all`) to keep "
            "all of its own paragraphs"
        )
    if flagged:
        required = _dedupe([d for d in docs if d.is_supporting])
        own_extra = _dedupe([d for d in docs if not d.is_supporting])
        required_keys = {_key(d) for d in required}
        own_extra = [d for d in own_extra if _key(d) not in required_keys]
        if include == "gold":
            own_extra = []
    else:
        required, own_extra = _dedupe(docs), []
    return _Plan(
        record=record,
        required=required,
        own_extra=own_extra,
        excluded_titles=frozenset(d.title for d in docs),
        excluded_keys=frozenset(_key(d) for d in docs),
    )


def _pool(records: Sequence[QARecord]) -> list[Document]:
    """Every distinct (title, text) paragraph of all records, in first-seen order."""
    return _dedupe([d for r in records for d in r.documents])


def select_questions(records: Sequence[QARecord], num_questions: int | None,
                     seed: int) -> list[QARecord]:
    """All records, or a deterministic sample of `num_questions` kept in input order.

    The sample of k is a subset of the sample of any larger k (same seed).
    """
    if num_questions is None:
        return list(records)
    if num_questions < 1:
        raise MemrlInputError(f"num_questions must be at least 1, got {num_questions}")
    if num_questions > len(records):
        raise MemrlInputError(
            f"num_questions={num_questions} but the input has only {len(records)} questions"
        )
    chosen = sorted(
        i for i, _ in zip(_lazy_permutation(len(records), _rng(seed, "questions")),
                          range(num_questions))
    )
    return [records[i] for i in chosen]


def _check_args(num_docs: int, include: str) -> None:
    if include not in INCLUDE_MODES:
        raise MemrlInputError(f"include must be one of {', '.join(INCLUDE_MODES)}, got '{include}'")
    if isinstance(num_docs, bool) or not isinstance(num_docs, int) or num_docs < 1:
        raise MemrlInputError(f"num_docs must be a positive integer, got {num_docs!r}")


def _check_plan(plan: _Plan, num_docs: int, pool: Sequence[Document],
                pool_titles: Counter[str]) -> None:
    rid = plan.record.id
    if len(plan.required) > num_docs:
        raise MemrlInputError(
            f"num_docs={num_docs} is smaller than the {len(plan.required)} paragraphs question "
            f"'{rid}' must keep"
        )
    need = num_docs - len(plan.required) - len(plan.own_extra)
    if need > 0:
        available = len(pool) - sum(pool_titles[t] for t in plan.excluded_titles)
        if need > available:
            raise MemrlInputError(
                f"distractor pool too small for num_docs={num_docs}: question '{rid}' needs "
                f"{need} paragraphs from other questions but only {available} exist; "
                "use more questions or a smaller num_docs"
            )


def _question_documents(plan: _Plan, index: int, num_docs: int, seed: int,
                        pool: Sequence[Document]) -> list[Document]:
    room = num_docs - len(plan.required)
    own = plan.own_extra
    if len(own) > room:
        take = sorted(i for i, _ in zip(_lazy_permutation(len(own), _rng(seed, index, "own")),
                                        range(room)))
        own = [own[i] for i in take]
    chosen = list(plan.required) + own
    need = num_docs - len(chosen)
    if need > 0:
        for i in _lazy_permutation(len(pool), _rng(seed, index, "pool")):
            doc = pool[i]
            if doc.title in plan.excluded_titles or _key(doc) in plan.excluded_keys:
                continue
            chosen.append(doc)
            need -= 1
            if need == 0:
                break
    _rng(seed, index, "order", num_docs).shuffle(chosen)
    return chosen


def _checked_plans(records: Sequence[QARecord], num_questions: int | None, seed: int,
                   include: str, sizes: Sequence[int]) -> tuple[list[_Plan], list[Document]]:
    """The plans of the selected questions, each checked at every N of `sizes`, and the
    pool of paragraphs the distractors come from."""
    if not records:
        raise MemrlInputError("no questions to build RULER-HQA from")
    selected = select_questions(records, num_questions, seed)
    pool = _pool(records)
    pool_titles = Counter(d.title for d in pool)
    plans = []
    for record in selected:
        plan = _plan(record, include)
        for n in sizes:
            _check_plan(plan, n, pool, pool_titles)
        plans.append(plan)
    return plans, pool


def build_ruler_hqa(records: Sequence[QARecord], num_docs: int, *, seed: int = 42,
                    num_questions: int | None = None, include: str = "gold") -> list[dict]:
    """RULER-HQA items for one N: `{"index", "input", "answers", "context", "num_docs"}`,
    plus `"facts"` (the sentences the question needs, `supporting_facts`) when the question
    knows them: MemAgent's scripts ignore the extra key; memrl's evaluation checks whether
    the agent's memory keeps them (`memrl.eval.memory_trace`).

    Distractors never come from the question's own paragraphs nor share a title with them
    (a different version of a gold paragraph would leak or contradict it).
    """
    _check_args(num_docs, include)
    plans, pool = _checked_plans(records, num_questions, seed, include, [num_docs])
    return [
        {
            "index": index,
            "input": plan.record.question,
            "answers": list(plan.record.answers),
            "context": render_documents(_question_documents(plan, index, num_docs, seed, pool)),
            "num_docs": num_docs,
            **({"facts": facts} if (facts := supporting_facts(plan.record)) else {}),
        }
        for index, plan in enumerate(plans)
    ]


def write_ruler_hqa(records: Sequence[QARecord], out_dir: str | Path,
                    num_docs_list: Sequence[int], seed: int = 42, *,
                    num_questions: int | None = None, include: str = "gold") -> list[Path]:
    """Write `eval_{N}.json` for each N (atomically); returns the paths in the given order.

    Every N is checked before any file is written, so a bad N leaves no partial set behind.
    """
    if not num_docs_list:
        raise MemrlInputError("give at least one num_docs")
    ns = list(dict.fromkeys(num_docs_list))
    for n in ns:
        _check_args(n, include)
    _checked_plans(records, num_questions, seed, include, [min(ns), max(ns)])
    paths = []
    for n in ns:
        items = build_ruler_hqa(records, n, seed=seed, num_questions=num_questions,
                                include=include)
        paths.append(write_json_atomic(ruler_hqa_path(out_dir, n), items))
    return paths

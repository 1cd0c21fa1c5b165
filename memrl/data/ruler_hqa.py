"""RULER-HQA: HotpotQA questions hidden among N paragraphs, in MemAgent's `eval_{N}.json` format.

A file is a JSON list of `{"index", "input", "answers", "context", "num_docs"}`. For each
question the context holds its gold paragraphs plus distractors drawn from *other* questions'
paragraphs, shuffled and rendered as `Document {i}:\\n{title}\\n{text}` (as RULER's qa task).

Loading also reads MemAgent's index-list files (its published eval_12800 / eval_25600, where
`context` is a list of indices into the sorted HotpotQA dev paragraph pool), given the pool.

Determinism: every random choice is seeded by (seed, question index) only, never by shared
state, so the same inputs give byte-identical files and the files for different N do not
depend on each other. The distractors are drawn as a prefix of one fixed random permutation
per question, so the distractors of a smaller N are a subset of those of a larger N.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.data.io import (
    check_unique_ids,
    clean_answers,
    expect_object,
    get_field,
    get_id,
    get_string,
    iter_jsonl,
    make_record,
    read_json,
    string_list,
    type_name,
    write_json_atomic,
)
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
            "are unknown; use include='all' (--include all) to keep all of its own paragraphs"
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
    if not records:
        raise MemrlInputError("no questions to build RULER-HQA from")
    selected = select_questions(records, num_questions, seed)
    pool = _pool(records)
    pool_titles = Counter(d.title for d in pool)
    plans = [_plan(r, include) for r in selected]
    for plan in plans:
        _check_plan(plan, num_docs, pool, pool_titles)
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
    if not records:
        raise MemrlInputError("no questions to build RULER-HQA from")
    selected = select_questions(records, num_questions, seed)
    pool = _pool(records)
    pool_titles = Counter(d.title for d in pool)
    for plan in (_plan(r, include) for r in selected):
        for n in (min(ns), max(ns)):
            _check_plan(plan, n, pool, pool_titles)
    paths = []
    for n in ns:
        items = build_ruler_hqa(records, n, seed=seed, num_questions=num_questions,
                                include=include)
        paths.append(write_json_atomic(ruler_hqa_path(out_dir, n), items))
    return paths


# ---------------------------------------------------------------------------------------------
# loading

POOL_DOCUMENT_TEMPLATE = "Document {index}:\n{document}"
"""MemAgent's `DOCUMENT_PROMPT`; a pool entry is `title\\ntext`, so this renders exactly as
`records.DOCUMENT_TEMPLATE` (`Document {i}:\\n{title}\\n{text}`)."""


def load_hotpotqa_pool(path: str | Path) -> list[str]:
    """The paragraph pool MemAgent's index-list files (eval_12800 / eval_25600) index into.

    As `read_hotpotqa` in MemAgent's taskutils/memory_data/different_docs_eval.py (and
    processing.py): every `[title, sentences]` pair of every question's `context` in the
    official HotpotQA dev file (`hotpot_dev_distractor_v1.json`, saved there as
    `hotpotqa_dev.json`) becomes `f"{title}\\n{''.join(sentences)}"` (sentences joined with
    no separator); the distinct strings are SORTED (Python string order, not the order of
    first appearance), and a file index is a position in that sorted list. (The largest N
    of the published scripts, 66,635, is presumably the size of that pool.)
    """
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise MemrlInputError(
            f"expected the HotpotQA dev JSON (a list of questions), got {type_name(data)}",
            location=str(path),
        )
    docs: set[str] = set()
    for i, value in enumerate(data):
        location = f"{path} item {i}"
        obj = expect_object(value, location, "item")
        context = get_field(obj, "context", list, location)
        for j, pair in enumerate(context):
            ok = (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                  and isinstance(pair[1], list) and all(isinstance(x, str) for x in pair[1]))
            if not ok:
                raise MemrlInputError(
                    f"field 'context[{j}]' must be a [title, [sentence, ...]] pair",
                    location=location,
                )
            docs.add(f"{pair[0]}\n{''.join(pair[1])}")
    if not docs:
        raise MemrlInputError("the HotpotQA pool file holds no paragraphs", location=str(path))
    return sorted(docs)


def render_pool_context(indices: Sequence[int], pool: Sequence[str]) -> str:
    """The context string of an index-list record (MemAgent's `set_context` in
    taskutils/memory_eval/ruler_hqa_over1m.py): pool[i] as `Document {k}:\\n...`, 1-based,
    joined by blank lines. Indices must be valid (see `load_ruler_hqa`)."""
    return "\n\n".join(POOL_DOCUMENT_TEMPLATE.format(index=k, document=pool[i])
                       for k, i in enumerate(indices, start=1))


class LazyPool:
    """A paragraph pool read from its file on first use only (string files never need it).

    Pass one LazyPool to several `load_ruler_hqa` calls to read the 47 MB dev file once.
    """

    def __init__(self, source: str | Path | Sequence[str] | None) -> None:
        self._path = Path(source) if isinstance(source, (str, Path)) else None
        self._docs: Sequence[str] | None = None if self._path is not None else source

    @property
    def name(self) -> str:
        return str(self._path) if self._path is not None else "the given pool"

    def docs(self) -> Sequence[str] | None:
        """The pool, read now if needed; None when no pool was given."""
        if self._docs is None and self._path is not None:
            self._docs = load_hotpotqa_pool(self._path)
        return self._docs


PoolSource = str | Path | Sequence[str] | LazyPool
"""A HotpotQA dev JSON file (e.g. `hotpot_dev_distractor_v1.json`), its pool already read
with `load_hotpotqa_pool`, or a LazyPool."""


def _as_pool(pool: PoolSource | None) -> LazyPool:
    return pool if isinstance(pool, LazyPool) else LazyPool(pool)


def load_ruler_hqa(path: str | Path, *, pool: PoolSource | None = None,
                   expected_num_docs: int | None = None) -> list[QARecord]:
    """Read an `eval_{N}.json` file (or the same records as JSONL) into QARecords.

    id = str(index) (or the row number), question = input, answers = list (or one string),
    context kept as the string, facts = the optional `facts` list (memrl's builder writes it);
    unknown extra fields are ignored (published files carry more).

    `context` may instead be a list of paragraph indices (MemAgent's eval_12800 / eval_25600
    files, written by `generate_index_only` in taskutils/memory_data/different_docs_eval.py);
    it is rendered from `pool` (see `load_hotpotqa_pool`) into exactly the string the
    equivalent string file holds. Such a file without `pool`, or an index outside the pool,
    is a MemrlInputError naming the file, the item and the index. Contexts are rendered
    eagerly, as the published script does (tens of MB per record at N=25,600).

    `expected_num_docs`: the N the caller loads this file as (`load_ruler_hqa_dir` passes
    it). Each record's `num_docs` (or, without it, the length of its index list) must then
    equal N. None (a file given explicitly) skips this check.
    """
    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        items = [(f"{path}:{lineno}", value) for lineno, value in iter_jsonl(path)]
    else:
        data = read_json(path)
        if not isinstance(data, list):
            raise MemrlInputError(f"expected a JSON list of RULER-HQA items, got {type_name(data)}",
                                  location=str(path))
        if not data:
            raise MemrlInputError("file has no items (empty list)", location=str(path))
        items = [(f"{path} item {i}", value) for i, value in enumerate(data)]
    source = _as_pool(pool)
    records = []
    for row, (loc, value) in enumerate(items):
        record = ruler_item_record(value, row, loc, pool=source)
        if expected_num_docs is not None and record.num_docs is not None \
                and record.num_docs != expected_num_docs:
            raise MemrlInputError(
                f"num_docs is {record.num_docs} but the file was loaded as "
                f"N={expected_num_docs}; pass the file alone to load it anyway",
                location=loc,
            )
        records.append(record)
    return check_unique_ids(records, [loc for loc, _ in items])


def _pool_context(indices: list[Any], pool: LazyPool, location: str) -> str:
    for k, idx in enumerate(indices):
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise MemrlInputError(
                f"field 'context[{k}]' must be an integer paragraph index, got {type_name(idx)}",
                location=location,
            )
    docs = pool.docs()
    if docs is None:
        raise MemrlInputError(
            "context is a list of paragraph indices (MemAgent's index-list format); pass "
            "pool=<HotpotQA dev JSON, e.g. hotpot_dev_distractor_v1.json> to render it",
            location=location,
        )
    size = len(docs)
    for k, idx in enumerate(indices):
        if not 0 <= idx < size:
            raise MemrlInputError(
                f"context[{k}] = {idx} is out of range for the pool of {size} paragraphs "
                f"({pool.name})",
                location=location,
            )
    return render_pool_context(indices, docs)


def ruler_item_record(value: Any, row: int, location: str, *,
                      pool: PoolSource | None = None) -> QARecord:
    """One RULER-HQA item (its context a string, or paragraph indices into `pool`)."""
    obj = expect_object(value, location, "item")
    qid = get_id(obj, "index", location) if obj.get("index") is not None else str(row)
    question = get_string(obj, "input", location)
    answers = get_field(obj, "answers", (list, str), location)
    if isinstance(answers, str):
        answers = [answers]
    answers = clean_answers(string_list(answers, "answers", location), "answers", location)
    context = get_field(obj, "context", (str, list), location)
    num_docs = get_field(obj, "num_docs", int, location, required=False)
    facts = string_list(get_field(obj, "facts", list, location, required=False) or [],
                        "facts", location)
    if isinstance(context, list):
        if num_docs is None:
            num_docs = len(context)
        context = _pool_context(context, _as_pool(pool), location)
    return make_record(location, id=qid, question=question, answers=answers, context=context,
                       num_docs=num_docs, facts=facts)


def load_ruler_hqa_dir(directory: str | Path, num_docs_list: Sequence[int], *,
                       pool: PoolSource | None = None) -> dict[int, list[QARecord]]:
    """Load `eval_{N}.json` for each N from one directory; one error lists every missing N.

    Each file's records must say `num_docs` = its N (see `load_ruler_hqa`). A pool path is
    read once, and only if some file holds index lists.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise MemrlInputError("RULER-HQA directory not found", location=str(directory))
    ns = list(dict.fromkeys(num_docs_list))
    if not ns:
        raise MemrlInputError("give at least one num_docs")
    missing = [ruler_hqa_path(directory, n).name for n in ns
               if not ruler_hqa_path(directory, n).is_file()]
    if missing:
        names = (p.name for p in directory.glob("eval_*.json"))
        present = sorted((n for n in names if re.fullmatch(r"eval_\d+\.json", n)),
                         key=lambda name: int(name[5:-5]))
        raise MemrlInputError(
            f"missing {', '.join(missing)} (present: {', '.join(present) or 'none'}); "
            "create them with `memrl prepare ruler-hqa`",
            location=str(directory),
        )
    shared = _as_pool(pool)
    return {n: load_ruler_hqa(ruler_hqa_path(directory, n), pool=shared, expected_num_docs=n)
            for n in ns}


# ---------------------------------------------------------------------------------------------
# MemAgent's builder (style "memagent")
#
# As `generate_input_output` / `generate_index_only` in MemAgent's
# taskutils/memory_data/different_docs_eval.py (evaluation, eval_{N}.json) and processing.py
# (training, parquet), read side by side with this code:
#   - the pool is every distinct `f"{title}\n{text}"` paragraph of the INPUT file, sorted
#     (`read_hotpotqa`), so a file index is a position in the sorted pool;
#   - a question keeps all of its own paragraphs (gold and HotpotQA's distractors, in input
#     order, duplicates included) and gets N - own random paragraphs from the rest of the pool
#     (`random.sample` of the pool indices not among its own); N equal to the pool size takes
#     the whole pool;
#   - the list is shuffled with `random.Random(4).shuffle`: the seed is fixed and the same for
#     every question, so all lists of one length N go through ONE permutation;
#   - paragraph k (1-based) renders as `Document {k}:\n{title}\n{text}`, joined by blank lines;
#   - `index` is the question's position in the input file; the largest files store `context`
#     as the list of pool indices (the published script does so for N > 10,000).
# What differs: the published draws come from the process-global `random` (seeded 42, but
# consumed by a process pool, so they are not reproducible); here each (question, N) draws
# from its own `random.Random` seeded by (seed, index, N), so files are byte-stable and do
# not depend on each other or on which questions were selected.

STYLES = ("memrl", "memagent")
"""`memrl prepare ruler-hqa --style`: memrl (gold paragraphs + other questions' paragraphs,
seeded per question) or memagent (MemAgent's published builder, above)."""

MEMAGENT_SHUFFLE_SEED = 4
"""The fixed seed of `random.Random(4).shuffle(all_docs)` in MemAgent's builders."""

MEMAGENT_SEED = 42
"""Default seed of the random paragraphs (MemAgent's scripts call `random.seed(42)`)."""


@dataclass(frozen=True)
class MemAgentPool:
    """The sorted paragraph pool of an input file and each question's own paragraphs in it."""

    docs: list[str]
    """Distinct `title\\ntext` paragraphs, sorted (MemAgent's `DOCS`)."""
    own: list[list[int]]
    """Per input question, in input order: the pool indices of its paragraphs, in the order
    of its context (MemAgent's `QAS[i]['context']`)."""


def memagent_pool(records: Sequence[QARecord]) -> MemAgentPool:
    """`read_hotpotqa` of MemAgent's builders over already-loaded records.

    For the official HotpotQA JSON, `docs` equals `load_hotpotqa_pool` of the same file.
    """
    keys = []
    for record in records:
        if not record.documents:
            raise MemrlInputError(
                f"question '{record.id}' has no paragraphs (a ready-made context string cannot "
                "be rebuilt into RULER-HQA)"
            )
        keys.append([f"{d.title}\n{d.text}" for d in record.documents])
    docs = sorted({k for ks in keys for k in ks})
    where = {k: i for i, k in enumerate(docs)}
    return MemAgentPool(docs=docs, own=[[where[k] for k in ks] for ks in keys])


@functools.lru_cache(maxsize=4)
def memagent_permutation(length: int, shuffle_seed: int = MEMAGENT_SHUFFLE_SEED
                         ) -> tuple[int, ...]:
    """`random.Random(shuffle_seed).shuffle` of any list of `length` items as positions:
    the shuffled list's k-th item is the original's item `perm[k]` (the same for every
    question of one N, so it is computed once)."""
    positions = list(range(length))
    random.Random(shuffle_seed).shuffle(positions)
    return tuple(positions)


def memagent_doc_indices(own: Sequence[int], pool_size: int, num_docs: int, *, index: int,
                         seed: int = MEMAGENT_SEED,
                         shuffle_seed: int = MEMAGENT_SHUFFLE_SEED) -> list[int]:
    """The pool indices of one question's context, in reading order (`generate_index_only`).

    `own` (the question's paragraphs) plus `num_docs - len(own)` indices drawn by
    `rng.sample` from the pool indices not in `own` (in increasing order, as published), with
    `rng = random.Random` seeded by (seed, index, num_docs); `num_docs == pool_size` takes the
    whole pool. The list is then shuffled as `random.Random(shuffle_seed).shuffle` does.
    """
    if num_docs > pool_size:
        raise MemrlInputError(
            f"num_docs={num_docs} is larger than the pool of {pool_size} paragraphs"
        )
    if num_docs == pool_size:
        return list(memagent_permutation(pool_size, shuffle_seed))
    need = num_docs - len(own)
    if need < 0:
        raise MemrlInputError(
            f"num_docs={num_docs} is smaller than the {len(own)} paragraphs question "
            f"{index} must keep"
        )
    chosen = list(own)
    if need:
        candidates = list(range(pool_size))
        for e in sorted(set(own), reverse=True):
            del candidates[e]
        rng = random.Random(f"memagent:{seed}:{index}:{num_docs}")
        chosen += rng.sample(candidates, need)
    return [chosen[i] for i in memagent_permutation(num_docs, shuffle_seed)]


def _check_memagent_args(pool: MemAgentPool, num_docs_list: Sequence[int],
                         questions: Sequence[int]) -> None:
    size = len(pool.docs)
    for n in num_docs_list:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise MemrlInputError(f"num_docs must be a positive integer, got {n!r}")
        if n > size:
            raise MemrlInputError(
                f"num_docs={n} is larger than the pool of {size} paragraphs of the input "
                f"(at most {size}: the whole pool)"
            )
    for q in questions:
        if not 0 <= q < len(pool.own):
            raise MemrlInputError(f"question position {q} is out of range "
                                  f"(the input has {len(pool.own)} questions)")
    smallest = min(num_docs_list)
    if smallest < size:
        worst = max(questions, key=lambda q: len(pool.own[q]))
        if len(pool.own[worst]) > smallest:
            raise MemrlInputError(
                f"num_docs={smallest} is smaller than the {len(pool.own[worst])} paragraphs "
                f"question {worst} must keep"
            )


def build_memagent_ruler_hqa(records: Sequence[QARecord], num_docs: int, *,
                             questions: Sequence[int] | None = None,
                             seed: int = MEMAGENT_SEED,
                             shuffle_seed: int = MEMAGENT_SHUFFLE_SEED,
                             index_list: bool = False,
                             pool: MemAgentPool | None = None) -> list[dict]:
    """MemAgent-style `eval_{N}.json` items: `{"context", "input", "answers", "num_docs",
    "index"}` (the published key order), one per question position in `questions` (default:
    all, in input order). `index_list=True` stores `context` as the list of pool indices
    (load such a file with `pool=` the input file, which must then be the official HotpotQA
    JSON); otherwise it is the rendered string. `pool`: `memagent_pool(records)`, if already
    built."""
    if not records:
        raise MemrlInputError("no questions to build RULER-HQA from")
    pool = pool if pool is not None else memagent_pool(records)
    questions = list(range(len(records))) if questions is None else list(questions)
    _check_memagent_args(pool, [num_docs], questions)
    items = []
    for q in questions:
        indices = memagent_doc_indices(pool.own[q], len(pool.docs), num_docs, index=q,
                                       seed=seed, shuffle_seed=shuffle_seed)
        record = records[q]
        items.append({
            "context": indices if index_list else render_pool_context(indices, pool.docs),
            "input": record.question,
            "answers": list(record.answers),
            "num_docs": num_docs,
            "index": q,
        })
    return items


def write_memagent_ruler_hqa(records: Sequence[QARecord], out_dir: str | Path,
                             num_docs_list: Sequence[int], *,
                             questions: Sequence[int] | None = None,
                             seed: int = MEMAGENT_SEED,
                             shuffle_seed: int = MEMAGENT_SHUFFLE_SEED,
                             index_list_from: int | None = None) -> list[Path]:
    """Write MemAgent-style `eval_{N}.json` for each N (atomically), the files with
    N >= `index_list_from` in the index-list form; returns the paths in the given order.
    Every N is checked before any file is written."""
    if not num_docs_list:
        raise MemrlInputError("give at least one num_docs")
    if not records:
        raise MemrlInputError("no questions to build RULER-HQA from")
    ns = list(dict.fromkeys(num_docs_list))
    pool = memagent_pool(records)
    questions = list(range(len(records))) if questions is None else list(questions)
    _check_memagent_args(pool, ns, questions)
    paths = []
    for n in ns:
        as_list = index_list_from is not None and n >= index_list_from
        items = build_memagent_ruler_hqa(records, n, questions=questions, seed=seed,
                                         shuffle_seed=shuffle_seed, index_list=as_list,
                                         pool=pool)
        paths.append(write_json_atomic(ruler_hqa_path(out_dir, n), items))
    return paths


MEMAGENT_DATA_SOURCE = "hotpotqa"
"""`data_source` of MemAgent's rows: verl picks the reward by it (`hotpotqa.compute_score`)."""


def memagent_training_rows(records: Sequence[QARecord], num_docs: int, *,
                           questions: Sequence[int] | None = None,
                           seed: int = MEMAGENT_SEED,
                           shuffle_seed: int = MEMAGENT_SHUFFLE_SEED) -> list[dict]:
    """MemAgent's training/validation rows (processing.py `generate_input_output`), with
    the same contexts as `build_memagent_ruler_hqa`:

        {"data_source": "hotpotqa", "prompt": [{"role": "user", "content": question}],
         "context": rendered, "ability": "memory",
         "reward_model": {"style": "rule", "ground_truth": answers},
         "extra_info": {"index": position, "question": question, "num_docs": N}}

    Write them with `memrl.data.hotpotqa.save_memagent_rows`; the published run reads 200
    paragraphs per question (`generate_dataset(80000, ..., 200, ...)` on HotpotQA train).
    """
    items = build_memagent_ruler_hqa(records, num_docs, questions=questions, seed=seed,
                                     shuffle_seed=shuffle_seed)
    return [
        {
            "data_source": MEMAGENT_DATA_SOURCE,
            "prompt": [{"role": "user", "content": item["input"]}],
            "context": item["context"],
            "ability": "memory",
            "reward_model": {"style": "rule", "ground_truth": item["answers"]},
            "extra_info": {"index": item["index"], "question": item["input"],
                           "num_docs": num_docs},
        }
        for item in items
    ]

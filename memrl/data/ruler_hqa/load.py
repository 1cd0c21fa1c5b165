"""Reading RULER-HQA files (`eval_{N}.json`, or the same records as JSONL) into QARecords.

A file is a JSON list of `{"index", "input", "answers", "context", "num_docs"}`. Loading also
reads MemAgent's index-list files (its published eval_12800 / eval_25600, where `context` is
a list of indices into the sorted HotpotQA dev paragraph pool), given the pool.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memrl.data.io import (
    check_unique_ids,
    clean_answers,
    expect_list,
    expect_object,
    get_field,
    get_id,
    get_string,
    iter_jsonl,
    make_record,
    read_json,
    string_list,
    type_name,
)
from memrl.data.records import QARecord
from memrl.data.ruler_hqa.build import ruler_hqa_path
from memrl.errors import MemrlInputError

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
        data = expect_list(read_json(path), str(path), "items", "RULER-HQA items")
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

"""MemAgent's RULER-HQA builder (`memrl prepare ruler-hqa style=memagent`) and its
training rows.

As `generate_input_output` / `generate_index_only` in MemAgent's
taskutils/memory_data/different_docs_eval.py (evaluation, eval_{N}.json) and processing.py
(training, parquet), read side by side with this code:
  - the pool is every distinct `f"{title}\\n{text}"` paragraph of the INPUT file, sorted
    (`read_hotpotqa`), so a file index is a position in the sorted pool;
  - a question keeps all of its own paragraphs (gold and HotpotQA's distractors, in input
    order, duplicates included) and gets N - own random paragraphs from the rest of the pool
    (`random.sample` of the pool indices not among its own); N equal to the pool size takes
    the whole pool;
  - the list is shuffled with `random.Random(4).shuffle`: the seed is fixed and the same for
    every question, so all lists of one length N go through ONE permutation;
  - paragraph k (1-based) renders as `Document {k}:\\n{title}\\n{text}`, joined by blank lines;
  - `index` is the question's position in the input file; the largest files store `context`
    as the list of pool indices (the published script does so for N > 10,000).
What differs: the published draws come from the process-global `random` (seeded 42, but
consumed by a process pool, so they are not reproducible); here each (question, N) draws
from its own `random.Random` seeded by (seed, index, N), so files are byte-stable and do
not depend on each other or on which questions were selected.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from memrl.data.io import write_json_atomic
from memrl.data.records import QARecord
from memrl.data.ruler_hqa.build import ruler_hqa_path
from memrl.data.ruler_hqa.load import render_pool_context
from memrl.errors import MemrlInputError

STYLES = ("memrl", "memagent")
"""`memrl prepare ruler-hqa style=...`: memrl (gold paragraphs + other questions' paragraphs,
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

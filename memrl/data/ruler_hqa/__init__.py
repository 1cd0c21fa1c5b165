"""RULER-HQA: HotpotQA questions hidden among N paragraphs, in MemAgent's `eval_{N}.json` format.

`build`: memrl's builder (gold paragraphs + other questions' paragraphs, seeded per question);
`memagent`: MemAgent's published builder and its training rows; `load`: reading the files,
the published index-list ones included (with the HotpotQA dev paragraph pool).
"""

from __future__ import annotations

from memrl.data.ruler_hqa.build import (
    FILE_TEMPLATE,
    INCLUDE_MODES,
    build_ruler_hqa,
    ruler_hqa_path,
    select_questions,
    write_ruler_hqa,
)
from memrl.data.ruler_hqa.load import (
    LazyPool,
    POOL_DOCUMENT_TEMPLATE,
    PoolSource,
    load_hotpotqa_pool,
    load_ruler_hqa,
    load_ruler_hqa_dir,
    render_pool_context,
    ruler_item_record,
)
from memrl.data.ruler_hqa.memagent import (
    MEMAGENT_DATA_SOURCE,
    MEMAGENT_SEED,
    MEMAGENT_SHUFFLE_SEED,
    MemAgentPool,
    STYLES,
    build_memagent_ruler_hqa,
    memagent_doc_indices,
    memagent_permutation,
    memagent_pool,
    memagent_training_rows,
    write_memagent_ruler_hqa,
)

__all__ = [
    "FILE_TEMPLATE",
    "INCLUDE_MODES",
    "LazyPool",
    "MEMAGENT_DATA_SOURCE",
    "MEMAGENT_SEED",
    "MEMAGENT_SHUFFLE_SEED",
    "MemAgentPool",
    "POOL_DOCUMENT_TEMPLATE",
    "PoolSource",
    "STYLES",
    "build_memagent_ruler_hqa",
    "build_ruler_hqa",
    "load_hotpotqa_pool",
    "load_ruler_hqa",
    "load_ruler_hqa_dir",
    "memagent_doc_indices",
    "memagent_permutation",
    "memagent_pool",
    "memagent_training_rows",
    "render_pool_context",
    "ruler_hqa_path",
    "ruler_item_record",
    "select_questions",
    "write_memagent_ruler_hqa",
    "write_ruler_hqa",
]

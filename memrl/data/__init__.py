"""Read every supported file format into validated records."""

from memrl.data.biographies import make_biography_records, write_biographies
from memrl.data.hotpotqa import (
    load_hotpotqa,
    load_memagent_parquet,
    save_memagent_parquet,
    save_records,
    save_records_jsonl,
)
from memrl.data.records import Document, QARecord, render_documents, supporting_facts
from memrl.data.ruler_hqa import (
    build_ruler_hqa,
    load_ruler_hqa,
    load_ruler_hqa_dir,
    ruler_hqa_path,
    write_ruler_hqa,
)
from memrl.data.synthetic import make_synthetic_records, synthetic_corpus

__all__ = [
    "Document",
    "QARecord",
    "build_ruler_hqa",
    "load_hotpotqa",
    "load_memagent_parquet",
    "load_ruler_hqa",
    "load_ruler_hqa_dir",
    "make_biography_records",
    "make_synthetic_records",
    "render_documents",
    "ruler_hqa_path",
    "save_memagent_parquet",
    "save_records",
    "save_records_jsonl",
    "supporting_facts",
    "synthetic_corpus",
    "write_biographies",
    "write_ruler_hqa",
]

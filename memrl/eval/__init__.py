"""Evaluation runs (the agents without learning) and the reports they write."""

from memrl.eval.report import (
    markdown_table,
    plot_scores,
    read_jsonl,
    rich_table,
    write_json,
    write_jsonl,
)
from memrl.eval.ruler_hqa import evaluate_ruler_hqa

__all__ = [
    "evaluate_ruler_hqa",
    "markdown_table",
    "plot_scores",
    "read_jsonl",
    "rich_table",
    "write_json",
    "write_jsonl",
]

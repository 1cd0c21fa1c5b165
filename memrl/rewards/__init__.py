"""Rewards: answer extraction, normalisation and QA scores (EM / F1 / sub-EM)."""

from memrl.rewards.qa import (
    exact_match,
    extract_boxed,
    f1_score,
    normalize_answer,
    qa_scores,
    sub_exact_match,
)

__all__ = [
    "exact_match",
    "extract_boxed",
    "f1_score",
    "normalize_answer",
    "qa_scores",
    "sub_exact_match",
]

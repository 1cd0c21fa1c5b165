"""Natural-language biographies: a RULER-style one-fact task that can only be solved by reading.

`language`: the kinds of fact, sentence forms, question paraphrases and invented words;
`build`: the questions, their distractors (namesakes among them), records and files.
"""

from __future__ import annotations

from memrl.data.biographies.language import (
    COMPANY_KINDS,
    FORMS,
    INSTRUMENTS,
    JOBS,
    KINDS,
    QUESTIONS,
    SPLITS,
    Vocabulary,
    YEARS,
    article,
    asked_person,
    biography_question,
    biography_sentence,
    can_use_pronoun,
    pronoun_of,
    vocabulary,
)
from memrl.data.biographies.build import (
    BiographyQuestion,
    DEFAULT_HARD_SHARE,
    VALIDATION_START,
    WRITE_SPLITS,
    biography_paragraphs,
    biography_questions,
    biography_ruler_items,
    is_namesake_slot,
    make_biography_records,
    namesake_count,
    write_biographies,
    write_biography_eval,
)

__all__ = [
    "BiographyQuestion",
    "COMPANY_KINDS",
    "DEFAULT_HARD_SHARE",
    "FORMS",
    "INSTRUMENTS",
    "JOBS",
    "KINDS",
    "QUESTIONS",
    "SPLITS",
    "VALIDATION_START",
    "Vocabulary",
    "WRITE_SPLITS",
    "YEARS",
    "article",
    "asked_person",
    "biography_paragraphs",
    "biography_question",
    "biography_questions",
    "biography_ruler_items",
    "biography_sentence",
    "can_use_pronoun",
    "is_namesake_slot",
    "make_biography_records",
    "namesake_count",
    "pronoun_of",
    "vocabulary",
    "write_biographies",
    "write_biography_eval",
]

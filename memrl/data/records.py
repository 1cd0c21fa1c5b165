"""Validated records that every loader produces and every agent consumes."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

DOCUMENT_TEMPLATE = "Document {index}:\n{title}\n{text}"
"""How one paragraph is rendered in a long context (RULER-HQA / MemAgent, 1-based index)."""


class Document(BaseModel):
    """One paragraph of a long-document question: a title and its text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str
    text: str
    is_supporting: bool | None = None
    """True for a gold (supporting) paragraph, False for a distractor, None when unknown."""


class QARecord(BaseModel):
    """A question over a long context, with one or more acceptable gold answers.

    The context is either a list of documents (rendered on demand) or, for files that ship
    a ready-made string (RULER-HQA, MemAgent parquet), the string itself.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answers: list[str] = Field(min_length=1)
    documents: list[Document] = Field(default_factory=list)
    context: str | None = None
    num_docs: int | None = Field(default=None, ge=0)
    facts: list[str] = Field(default_factory=list)
    """The sentences of the context the question needs (its supporting facts), when a file
    says so (memrl's RULER-HQA files do); empty when unknown. See `supporting_facts`."""

    @field_validator("answers")
    @classmethod
    def _answers_are_strings(cls, answers: list[str]) -> list[str]:
        if not any(a.strip() for a in answers):
            raise ValueError("at least one gold answer must be non-empty")
        return answers

    def render_context(self) -> str:
        """The text the agent reads: the stored string, or the documents rendered in order."""
        if self.context is not None:
            return self.context
        return render_documents(self.documents)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def supporting_facts(record: QARecord) -> list[str]:
    """The facts `record`'s question needs: `record.facts` when given, else the first
    sentence of each supporting document, in document order (the synthetic data puts the
    one fact of each gold paragraph there); [] when neither is known."""
    if record.facts:
        return [f for f in record.facts if f.strip()]
    facts = []
    for doc in record.documents:
        if doc.is_supporting:
            first = _SENTENCE_END.split(doc.text.strip(), maxsplit=1)[0].strip()
            if first:
                facts.append(first)
    return facts


def render_documents(documents: list[Document]) -> str:
    """Render paragraphs as `Document {i}:\\n{title}\\n{text}`, 1-based, joined by blank lines."""
    return "\n\n".join(
        DOCUMENT_TEMPLATE.format(index=i, title=d.title, text=d.text)
        for i, d in enumerate(documents, start=1)
    )

"""Validated records that every loader produces and every agent consumes."""

from __future__ import annotations

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


def render_documents(documents: list[Document]) -> str:
    """Render paragraphs as `Document {i}:\\n{title}\\n{text}`, 1-based, joined by blank lines."""
    return "\n\n".join(
        DOCUMENT_TEMPLATE.format(index=i, title=d.title, text=d.text)
        for i, d in enumerate(documents, start=1)
    )

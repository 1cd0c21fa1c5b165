"""Documents of any length cut into token chunks as they are read (a MemAgent `ChunkSource`).

`chunk_context` (memrl.agents.memagent) tokenizes a whole context at once: fine for a
benchmark record, not for a million-token file (its ids alone take ~36 MB as Python ints,
and the text must be whole first). `DocumentChunks` makes the same chunks from a stream:

    text pieces ──► blocks of about BLOCK_CHARS characters, cut at a `safe_cut`
                ──► token ids of one block at a time
                ──► chunks of chunk_size ids, each decoded back to text (as chunk_context)

It holds at most one block and one chunk of ids. It reads the documents twice: once to
count their tokens (so the number of chunks is known before the first is read: progress,
`max_chunks`, `truncation: center`), once while the agent reads them.

Exactness. A block boundary is put only where no pre-token of a byte-level BPE (GPT-2,
Llama 3, Qwen, SmolLM: their split regexes) can span it: before a single space, or after a
single newline, between two non-blank characters (in those regexes a space joins the word
after it, a newline the punctuation before it, never the reverse). There, encoding the
blocks one by one gives the ids of encoding the whole text (tested against the whole-text
chunks). A text with neither in half a block (e.g. 32K characters without a single space
or line break) is cut where the block ends; so are tokenizers that add a prefix space to
every call (SentencePiece's legacy mode), which may then tokenize one word differently at
that boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from memrl.agents.memagent import TRUNCATIONS
from memrl.apps.ask.documents import Document
from memrl.data.records import DOCUMENT_TEMPLATE
from memrl.errors import MemrlInputError

BLOCK_CHARS = 1 << 16
"""Characters tokenized in one call (about 16K tokens of English)."""


class TooManyTokens(MemrlInputError):
    """The documents have more tokens than a limit allows."""

    def __init__(self, limit: int, location: str) -> None:
        self.limit = limit
        super().__init__(f"more than {limit:,} tokens", location=location)


def safe_cut(text: str, limit: int) -> int:
    """Where to end a block of `text` of at most `limit` characters: the last place at or
    before `limit`, searched back to limit // 2, that is just before a single space between
    two non-blank characters (the space starts the next block) or just after a single
    newline between two non-blank characters (the newline ends the block); else `limit`
    itself."""
    if len(text) <= limit:
        return len(text)
    for cut in range(limit, max(1, limit // 2) - 1, -1):
        if _safe_at(text, cut):
            return cut
    return limit


def _safe_at(text: str, i: int) -> bool:
    """Whether no pre-token of a byte-level BPE can span text[:i] | text[i:] (0 < i < len)."""
    if text[i] == " ":
        return not text[i - 1].isspace() and i + 1 < len(text) and not text[i + 1].isspace()
    return (i >= 2 and text[i - 1] == "\n" and not text[i - 2].isspace()
            and not text[i].isspace())


def text_blocks(pieces: Iterable[str], block_chars: int = BLOCK_CHARS) -> Iterator[str]:
    """The concatenation of `pieces` in blocks of at most `block_chars` characters (about
    that many, the last shorter), each ending at a `safe_cut`."""
    if block_chars < 2:
        raise ValueError(f"block_chars must be >= 2, got {block_chars}")
    buffer = ""
    for piece in pieces:
        buffer += piece
        while len(buffer) > block_chars:
            cut = safe_cut(buffer, block_chars)
            yield buffer[:cut]
            buffer = buffer[cut:]
    if buffer:
        yield buffer


def document_pieces(documents: Sequence[Document]) -> Iterator[str]:
    """The text the agent reads: one document as it is; several each rendered as in
    RULER-HQA (`Document {i}:\\n{title}\\n{text}`, blank lines between; `Document.title`)."""
    for i, doc in enumerate(documents, start=1):
        if len(documents) > 1:
            head = DOCUMENT_TEMPLATE.format(index=i, title=doc.title, text="")
            yield ("\n\n" if i > 1 else "") + head
        yield from doc.pieces()


def encode_blocks(tokenizer: Any, blocks: Iterable[str]) -> Iterator[list[int]]:
    for block in blocks:
        yield tokenizer.encode(block, add_special_tokens=False)


class DocumentChunks:
    """`documents` cut into `chunk_size`-token chunk texts, streamed: a `ChunkSource`.

    Creating it reads the documents once to count their tokens (and checks that each has
    text: an empty one is a `MemrlInputError` naming it); iterating reads them again and
    yields the chunk texts (at most `max_chunks` of them, chosen by `truncation` as
    `split_token_ids` does). Each iteration starts from the beginning.
    """

    def __init__(
        self,
        tokenizer: Any,
        documents: Sequence[Document],
        chunk_size: int,
        max_chunks: int | None = None,
        truncation: str = "right",
        *,
        block_chars: int = BLOCK_CHARS,
        max_tokens: int | None = None,
    ) -> None:
        """`max_tokens`: refuse (MemrlInputError) documents of more tokens than this, as
        soon as the count passes it."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation must be one of {', '.join(TRUNCATIONS)}")
        if not documents:
            raise MemrlInputError("no document given")
        self.tokenizer = tokenizer
        self.documents = list(documents)
        self.chunk_size = chunk_size
        self.max_chunks = max_chunks
        self.truncation = truncation
        self.block_chars = block_chars
        for doc in self.documents:
            if not any(piece.strip() for piece in doc.pieces()):
                raise MemrlInputError("empty document (no text in it)", location=doc.name)
        self.context_tokens = self._count(max_tokens)
        self.keep = self._kept_ranges()

    def _count(self, max_tokens: int | None) -> int:
        total = 0
        for ids in self._ids():
            total += len(ids)
            if max_tokens is not None and total > max_tokens:
                where = self.documents[0].name if len(self.documents) == 1 else "documents"
                raise TooManyTokens(max_tokens, where)
        return total

    def _kept_ranges(self) -> list[tuple[int, int]]:
        """Token positions read, as [start, end) ranges (`split_token_ids`' choice)."""
        total, cap = self.context_tokens, self.max_chunks
        if cap is None or total <= cap * self.chunk_size:
            return [(0, total)]
        if self.truncation == "right":
            return [(0, cap * self.chunk_size)]
        half = cap * self.chunk_size // 2
        return [(0, half), (total - half, total)]

    @property
    def num_chunks(self) -> int:
        kept = sum(end - start for start, end in self.keep)
        return -(-kept // self.chunk_size)

    @property
    def capped(self) -> bool:
        return sum(end - start for start, end in self.keep) < self.context_tokens

    def _ids(self) -> Iterator[list[int]]:
        return encode_blocks(self.tokenizer,
                             text_blocks(document_pieces(self.documents), self.block_chars))

    def chunk_ids(self) -> Iterator[list[int]]:
        """The token ids of each chunk, in order."""
        pending: list[int] = []
        position = 0
        for ids in self._ids():
            for start, end in self.keep:
                lo, hi = max(start - position, 0), min(end - position, len(ids))
                if lo < hi:
                    pending.extend(ids[lo:hi])
            position += len(ids)
            while len(pending) >= self.chunk_size:
                yield pending[: self.chunk_size]
                del pending[: self.chunk_size]
            if position >= self.keep[-1][1]:
                break
        if pending:
            yield pending

    def __iter__(self) -> Iterator[str]:
        for ids in self.chunk_ids():
            yield self.tokenizer.decode(ids, skip_special_tokens=False)

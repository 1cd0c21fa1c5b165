"""A user's documents as streams of text: plain text, Markdown, HTML and PDF, any length.

`open_document(source)` checks a document where it enters (missing, a directory, an
unsupported type, binary content, an unreadable PDF: one `MemrlInputError` naming it) and
returns a `Document` whose `pieces()` yields its text a piece at a time, so that a file of
any size is never held whole:

    text, Markdown   read 1 MiB at a time (UTF-8, a BOM dropped); Markdown is read as it
                     is written: a language model reads its markup as well as we do
    HTML             fed to the standard library's `html.parser` 256 KiB at a time; the
                     text of the page in order, blocks on lines of their own, without
                     <script>, <style>, <head> and comments, entities decoded
    PDF              page by page with pypdf (`memrl[ask]`), pages apart by a blank line

Why these (`benchmarks/document_readers.py`, docs/benchmarks.md "Reading documents"): on
generated multi-page PDFs pypdf extracted the same words in the same order as pdfminer.six,
several times faster, and needs no other package (pdfminer.six: charset-normalizer and
cryptography); for HTML, BeautifulSoup builds a tree of the whole page and html2text
(GPL-3.0) keeps its whole text, while the standard library's parser streams it in a few MiB
whatever the page's size, with the same words in the same order.

A `str` given to the Python API is the text itself; a path (`os.PathLike`) is a file read by
its suffix. `-` on the command line is standard input, spooled to a temporary file first so
that it can be read twice (once to count its tokens, once to chunk them).
"""

from __future__ import annotations

import codecs
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import IO

from memrl.errors import MemrlInputError, require

TEXT_SUFFIXES = frozenset({"", ".txt", ".text", ".log", ".rst", ".tex", ".csv", ".tsv",
                           ".json", ".jsonl", ".xml", ".yaml", ".yml"})
"""Read as plain text (a file without a suffix too)."""
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
PDF_SUFFIXES = frozenset({".pdf"})
KINDS = ("text", "markdown", "html", "pdf")

READ_CHARS = 1 << 20
"""Characters of a text file read at a time."""
HTML_BYTES = 1 << 18
"""Bytes of an HTML file fed to the parser at a time."""
SNIFF_BYTES = 8192
"""How much of a file is looked at to tell text from binary (and HTML's charset)."""
STDIN = "-"


def supported_suffixes() -> str:
    names = sorted(s for s in TEXT_SUFFIXES | MARKDOWN_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES
                   if s)
    return ", ".join(names)


@dataclass(frozen=True)
class Document:
    """One document: a file of a known kind, or a text given as a string."""

    name: str
    """What error messages and traces call it: the path, or `text 1` for a string."""
    kind: str
    """One of KINDS."""
    path: Path | None = None
    text: str | None = None

    def pieces(self) -> Iterator[str]:
        """The document's text, a piece at a time (never the whole file at once)."""
        if self.text is not None:
            yield self.text
            return
        assert self.path is not None
        if self.kind in ("text", "markdown"):
            yield from _text_pieces(self.path, self.name)
        elif self.kind == "html":
            yield from html_pieces(self.path)
        else:
            yield from _pdf_pieces(self.path, self.name)


def open_document(source: str | os.PathLike[str], index: int = 1,
                  name: str | None = None) -> Document:
    """A checked `Document`: a `str` is the document's text (called `name`, else
    `text {index}`), a path a file (see module)."""
    if isinstance(source, str):
        return Document(name or f"text {index}", "text", text=source)
    path = Path(source)
    name = str(path)
    if not path.exists():
        raise MemrlInputError("document not found", location=name)
    if path.is_dir():
        raise MemrlInputError("is a directory, not a document", location=name)
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES:
        require("pypdf", extra="ask", feature="reading PDF documents")
        return Document(name, "pdf", path=path)
    if suffix in HTML_SUFFIXES:
        kind = "html"
    elif suffix in MARKDOWN_SUFFIXES:
        kind = "markdown"
    elif suffix in TEXT_SUFFIXES:
        kind = "text"
    else:
        raise MemrlInputError(
            f"unsupported document type {suffix!r}; memrl reads {supported_suffixes()} and "
            "files without a suffix", location=name)
    with path.open("rb") as f:
        head = f.read(SNIFF_BYTES)
    if b"\0" in head:
        raise MemrlInputError("binary file, not text", location=name)
    return Document(name, kind, path=path)


def spool_stdin(stream: IO[bytes] | None = None) -> Path:
    """Standard input copied to a temporary file (deleted at exit), named by what it holds
    (`.pdf`, `.html` or `.txt`) so that `open_document` reads it as such."""
    import atexit

    stream = stream if stream is not None else sys.stdin.buffer
    tmp = tempfile.NamedTemporaryFile(prefix="memrl-stdin-", delete=False)
    with tmp:
        shutil.copyfileobj(stream, tmp, 1 << 20)
    atexit.register(lambda: Path(tmp.name).unlink(missing_ok=True))
    with open(tmp.name, "rb") as f:
        head = f.read(SNIFF_BYTES)
    suffix = ".pdf" if head.startswith(b"%PDF-") else ".html" if _looks_like_html(head) \
        else ".txt"
    path = Path(tmp.name + suffix)
    os.replace(tmp.name, path)
    atexit.register(lambda: path.unlink(missing_ok=True))
    return path


def _looks_like_html(head: bytes) -> bool:
    start = head.lstrip()[:512].lower()
    return start.startswith((b"<!doctype html", b"<html")) or b"<html" in start


def _text_pieces(path: Path, name: str) -> Iterator[str]:
    with path.open("r", encoding="utf-8-sig", errors="strict", newline=None) as f:
        offset = 0
        while True:
            try:
                piece = f.read(READ_CHARS)
            except UnicodeDecodeError as exc:
                raise MemrlInputError(
                    f"not UTF-8 text (undecodable byte near character {offset + exc.start:,}); "
                    "convert it to UTF-8", location=name) from None
            if not piece:
                return
            offset += len(piece)
            yield piece


# ---- HTML --------------------------------------------------------------------------------

SKIPPED_TAGS = frozenset({"script", "style", "head", "template", "noscript", "svg"})
"""Elements whose content is not text a reader sees."""
BLOCK_TAGS = frozenset({
    "address", "article", "aside", "blockquote", "br", "dd", "details", "div", "dl", "dt",
    "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6",
    "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table",
    "tbody", "td", "tfoot", "th", "thead", "title", "tr", "ul",
})
"""Elements that start a new line of text."""
_SPACES = re.compile(r"[ \t\r\f\v]+")
_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


class HTMLText(HTMLParser):
    """The text of an HTML page, streamed: `feed` markup, then `take` the text so far.

    Whitespace is folded to one space, and blanks at the ends of lines dropped (as a
    browser shows text, except that <pre> keeps its line breaks); block elements start a new
    line; <title> is kept (the page's name).
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._out: list[str] = []
        self._skip = 0
        self._pre = 0
        self._title = False
        self._line_start = True

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._title = True
        elif tag in SKIPPED_TAGS:
            self._skip += 1
        if tag == "pre":
            self._pre += 1
        if tag in BLOCK_TAGS:
            self._newline()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in BLOCK_TAGS:
            self._newline()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._title = False
        elif tag in SKIPPED_TAGS and self._skip:
            self._skip -= 1
        if tag == "pre" and self._pre:
            self._pre -= 1
        if tag in BLOCK_TAGS:
            self._newline()

    def handle_data(self, data: str) -> None:
        if (self._skip and not self._title) or not data:
            return
        text = data if self._pre else _SPACES.sub(" ", data.replace("\n", " "))
        if self._line_start:
            text = text.lstrip(" ")
        if text:
            self._out.append(text)
            self._line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self._line_start:
            self._out.append("\n")
            self._line_start = True

    def take(self) -> str:
        """The text parsed since the last call."""
        text, self._out = "".join(self._out), []
        return text


def html_text(markup: str) -> str:
    """The text of a whole HTML string (see `HTMLText`)."""
    parser = HTMLText()
    parser.feed(markup)
    parser.close()
    return _fold_lines(parser.take()).strip()


def html_pieces(path: Path, piece_bytes: int = HTML_BYTES) -> Iterator[str]:
    """The text of an HTML file (see `HTMLText`), read `piece_bytes` at a time."""
    with path.open("rb") as f:
        charset = _html_charset(f.read(SNIFF_BYTES))
        f.seek(0)
        decoder = codecs.getincrementaldecoder(charset)(errors="replace")
        parser = HTMLText()
        started = False
        while True:
            data = f.read(piece_bytes)
            parser.feed(decoder.decode(data, final=not data))
            if not data:
                parser.close()
            text = _fold_lines(parser.take())
            if not started:  # no blank lines before the first text
                text = text.lstrip()
                started = bool(text)
            yield text
            if not data:
                return


def _html_charset(head: bytes) -> str:
    """UTF-8 unless a BOM or a <meta charset> says otherwise (and Python knows the codec)."""
    if head.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    match = _CHARSET.search(head)
    if match:
        try:
            return codecs.lookup(match.group(1).decode("ascii")).name
        except (LookupError, UnicodeDecodeError):
            pass
    return "utf-8"


_LINE_EDGE = re.compile(r"[ \t]*\n[ \t]*")
_BLANK_LINES = re.compile(r"\n{3,}")


def _fold_lines(text: str) -> str:
    """No blanks around line breaks, at most one empty line in a row."""
    return _BLANK_LINES.sub("\n\n", _LINE_EDGE.sub("\n", text))


# ---- PDF ---------------------------------------------------------------------------------


def _pdf_pieces(path: Path, name: str) -> Iterator[str]:
    pypdf = require("pypdf", extra="ask", feature="reading PDF documents")
    errors = (pypdf.errors.PyPdfError, ValueError, KeyError, TypeError, AttributeError,
              IndexError, OSError)
    try:
        reader = pypdf.PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise MemrlInputError("encrypted PDF (needs a password); decrypt it first",
                                  location=name)
        pages = len(reader.pages)
    except MemrlInputError:
        raise
    except errors as exc:
        raise MemrlInputError(f"not a readable PDF: {_first_line(exc)}", location=name) \
            from None
    for number in range(pages):
        try:
            text = reader.pages[number].extract_text() or ""
        except errors as exc:
            raise MemrlInputError(f"cannot read page {number + 1} of the PDF: "
                                  f"{_first_line(exc)}", location=name) from None
        yield text + ("\n\n" if number + 1 < pages else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

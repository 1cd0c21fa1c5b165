"""A user's documents as streams of text: plain text, Markdown, HTML and PDF, any length.

`open_document(source)` checks a document where it enters (missing, a directory, an
unsupported type, binary content, an unreadable PDF: one `MemrlInputError` naming it) and
returns a `Document` whose `pieces()` yields its text a piece at a time, so that a file of
any size is never held whole:

    text, Markdown   read 1 MiB at a time (UTF-8, a BOM dropped); Markdown is read as it
                     is written: a language model reads its markup as well as we do
    HTML             fed to memrl's scanner (`HTMLText`) 256 KiB at a time; the
                     text of the page in order, blocks on lines of their own, without
                     <script>, <style>, <head> and comments, entities decoded
    PDF              page by page with pypdf (`memrl[ask]`), pages apart by a blank line

Why these (`benchmarks/document_readers.py`, docs/lab/benchmarks.md "Reading documents"): on
generated multi-page PDFs pypdf extracted the same words in the same order as pdfminer.six,
several times faster, and needs no other package (pdfminer.six: charset-normalizer and
cryptography); for HTML, BeautifulSoup builds a tree of the whole page and html2text
(GPL-3.0) keeps its whole text, while the standard library's parser streams it in a few MiB
whatever the page's size, with the same words in the same order. memrl's own scanner
(issue 47) has since replaced `html.parser`, which kept an unclosed tag whole and scanned it
again at every piece; it reads the same text in time linear and memory constant.

A `str` given to the Python API is the text itself; a path (`os.PathLike`) is a file read by
its suffix. `-` on the command line is standard input, spooled to a temporary file first so
that it can be read twice (once to count its tokens, once to chunk them); so is a file
that can be read only once (a named pipe, a process substitution). Text must be valid
UTF-8: a text file, standard input or a string that is not is a one-line error (HTML is
decoded by its charset, an undecodable byte shown as U+FFFD, as a browser does).
"""

from __future__ import annotations

import codecs
import html
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
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

    @property
    def title(self) -> str:
        """The name the agent reads above the document's text when it reads several: a
        file's name without its folders (the prompt does not depend on the directory the
        command runs in, nor on how the path was typed); a text's name as it is."""
        return (Path(self.name).name or self.name) if self.path is not None else self.name

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
    `text {index}`), a path a file (see module), called `name` (else its path). A file that
    can be read only once (a named pipe, a process substitution `<(...)`, a device) is
    copied to a temporary file first (`spool`), as standard input is."""
    if isinstance(source, str):
        label = name or f"text {index}"
        return Document(label, "text", text=check_text(source, label))
    path = Path(source)
    name = name or str(path)
    if not path.exists():
        raise MemrlInputError("document not found", location=name)
    if path.is_dir():
        raise MemrlInputError("is a directory, not a document", location=name)
    if not path.is_file():  # a pipe: read once, so kept for the two readings
        try:
            with path.open("rb") as stream:
                path = spool(stream, path.suffix.lower())
        except OSError as exc:
            raise MemrlInputError(f"cannot read it: {exc.strerror or exc}", location=name) \
                from None
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


def check_text(text: str, location: str) -> str:
    """`text` if it is valid Unicode (what the tokenizer takes): a lone surrogate (what
    Python makes of undecodable bytes in a command-line argument, or JSON's `"\\ud800"`)
    is a one-line MemrlInputError naming the character."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        what = (f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF
                else f"lone surrogate U+{ord(char):04X}")
        raise MemrlInputError(f"not valid UTF-8 text ({what} at character {exc.start:,})",
                              location=location) from None
    return text


def spool_stdin(stream: IO[bytes] | None = None) -> Path:
    """Standard input copied to a temporary file (`spool`); a closed standard input is a
    one-line MemrlInputError."""
    if stream is None:
        if sys.stdin is None or sys.stdin.closed:
            raise MemrlInputError("standard input is closed; pipe a document into it",
                                  location=f"--document {STDIN}")
        stream = sys.stdin.buffer
    try:
        return spool(stream)
    except OSError as exc:  # e.g. EBADF: the descriptor was closed under Python
        raise MemrlInputError(f"cannot read standard input: {exc.strerror or exc}",
                              location=f"--document {STDIN}") from None


def spool(stream: IO[bytes], suffix: str = "") -> Path:
    """`stream` copied to a temporary file (deleted at exit) with `suffix`, or else named by
    what it holds (`.pdf`, `.html` or `.txt`) so that `open_document` reads it as such."""
    import atexit

    tmp = tempfile.NamedTemporaryFile(prefix="memrl-spool-", delete=False)
    with tmp:
        shutil.copyfileobj(stream, tmp, 1 << 20)
    atexit.register(lambda: Path(tmp.name).unlink(missing_ok=True))
    if not suffix:
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


RAW_TEXT_TAGS = frozenset({"script", "style"})
"""Elements whose content is raw text up to their end tag (no markup inside)."""
NAME_CHARS = 32
"""Characters of a tag name kept (longer names are no tag memrl knows)."""
_BLANKS = re.compile(r"[ \t\n\r\f]*")
_NAME = re.compile(r"[^ \t\n\r\f/>]*")
_ATTR_END = re.compile(r"""=[ \t\n\r\f]*(["']|\Z)|(/?)>""")
_MARKUP = re.compile(r"<(?:[A-Za-z/!?]|\Z)")
"""A `<` that starts a tag, a comment or a declaration (or may: the input ends there)."""
_ENTITY_CHARS = 32
"""A `&` this close to the end of what has arrived may start an entity not yet whole."""


class HTMLText:
    """The text of an HTML page, streamed: `feed` markup, then `take` the text so far.

    Whitespace is folded to one space, and blanks at the ends of lines dropped (as a
    browser shows text, except that <pre> keeps its line breaks); block elements start a new
    line; <title> is kept (the page's name).

    A scanner of its own (the HTML5 tokenizer's states that matter for text: data, tag,
    attribute values, comments, raw text, bogus comments), linear in time and constant in
    memory on any input: it keeps no attribute and no comment, only a tag's name (its first
    NAME_CHARS characters) and the few characters of a marker not yet whole (`<!-`,
    `</scr`, an entity). The standard library's `html.parser` keeps an unfinished tag or
    comment whole and scans it again at every `feed` (an unclosed tag took 6.3 s and 243 MB
    on 1 MB, issue 47). As in a browser, a tag or comment still open at the end of the page
    shows nothing, and a `<` not followed by a letter, `/`, `!` or `?` is text.
    """

    def __init__(self) -> None:
        self._out: list[str] = []
        self._skip = 0
        self._pre = 0
        self._title = False
        self._line_start = True
        self._buf = ""
        self._state = "text"
        self._tag = ""
        self._end_tag = False
        self._after_eq = False
        self._quote = ""
        self._raw_end: re.Pattern[str] | None = None

    def feed(self, data: str) -> None:
        self._buf += data
        self._scan(final=False)

    def close(self) -> None:
        self._scan(final=True)
        self._buf = ""

    def _scan(self, final: bool) -> None:
        buf, i = self._buf, 0
        while i < len(buf):
            step = getattr(self, "_in_" + self._state)(buf, i, final)
            if step is None:  # needs more input than has arrived
                break
            i = step
        self._buf = buf[i:]  # at most a marker's few characters

    def _in_text(self, buf: str, i: int, final: bool) -> int | None:
        found = _MARKUP.search(buf, i)  # a `<` of text ("a < b") is part of the text
        j = found.start() if found else -1
        if j < 0:
            end = len(buf)
            if not final:
                amp = buf.rfind("&", max(i, end - _ENTITY_CHARS))
                end = amp if amp >= 0 else end
            self._data(buf[i:end])
            return end if end > i else None
        if j > i:
            self._data(buf[i:j])
            return j
        after = buf[j + 1:j + 4]
        if not final and (after in ("", "/") or (after != "!--" and "!--".startswith(after))):
            return None
        if after[:1].isascii() and after[:1].isalpha():
            self._state, self._tag, self._end_tag = "tag", "", False
            return j + 1
        if after[:1] == "/" and after[1:2].isascii() and after[1:2].isalpha():
            self._state, self._tag, self._end_tag = "tag", "", True
            return j + 2
        if after == "!--":
            self._state = "comment"
            return j + 4
        if after[:1] in ("!", "?", "/"):
            self._state = "bogus"
            return j + 2
        self._data("<")
        return j + 1

    def _in_tag(self, buf: str, i: int, final: bool) -> int | None:
        end = _NAME.match(buf, i).end()
        if len(self._tag) < NAME_CHARS:
            self._tag += buf[i:min(end, i + NAME_CHARS - len(self._tag))].lower()
        if end < len(buf):
            self._state, self._after_eq = "attrs", False
        return end if end > i or self._state != "tag" else None

    def _in_attrs(self, buf: str, i: int, final: bool) -> int | None:
        if self._after_eq:  # a quote after `=` and blanks opens a quoted value
            k = _BLANKS.match(buf, i).end()
            if k == len(buf):
                return k if k > i else None
            self._after_eq = False
            if buf[k] in "\"'":
                self._state, self._quote = "quoted", buf[k]
                return k + 1
            i = k
        match = _ATTR_END.search(buf, i)
        if match is None:  # a `/` at the end may be the start of `/>` (a self-closing tag)
            end = len(buf) - (not final and buf.endswith("/"))
            return end if end > i else None
        if match.group(1):
            self._state, self._quote = "quoted", match.group(1)
        elif match.group(1) is not None:  # `=` and blanks end what has arrived
            self._after_eq = True
        else:
            self._tag_done(self_closing=bool(match.group(2)))
        return match.end()

    def _in_quoted(self, buf: str, i: int, final: bool) -> int | None:
        k = buf.find(self._quote, i)
        if k < 0:
            return len(buf) if len(buf) > i else None
        self._state = "attrs"
        return k + 1

    def _in_comment(self, buf: str, i: int, final: bool) -> int | None:
        k = buf.find("-->", i)
        if k < 0:
            keep = max(i, len(buf) - 2)  # `--` of an end not yet whole
            return keep if keep > i else None
        self._state = "text"
        return k + 3

    def _in_bogus(self, buf: str, i: int, final: bool) -> int | None:
        k = buf.find(">", i)
        if k < 0:
            return len(buf) if len(buf) > i else None
        self._state = "text"
        return k + 1

    def _in_raw(self, buf: str, i: int, final: bool) -> int | None:
        assert self._raw_end is not None
        match = self._raw_end.search(buf, i)
        if match is None:
            keep = max(i, len(buf) - NAME_CHARS)  # an end tag not yet whole
            return keep if keep > i else None
        self._state, self._tag, self._end_tag = "tag", "", True
        return match.start() + 2

    def _tag_done(self, self_closing: bool) -> None:
        tag, self._state = self._tag, "text"
        if self._end_tag:
            self.handle_endtag(tag)
        elif self_closing:
            self.handle_startendtag(tag)
        else:
            self.handle_starttag(tag)
            if tag in RAW_TEXT_TAGS:
                self._state = "raw"
                self._raw_end = re.compile(f"</{tag}(?=[ \\t\\n\\r\\f/>])", re.IGNORECASE)

    def _data(self, text: str) -> None:
        if text:
            self.handle_data(html.unescape(text))

    def handle_starttag(self, tag: str) -> None:
        if tag == "title":
            self._title = True
        elif tag in SKIPPED_TAGS:
            self._skip += 1
        if tag == "pre":
            self._pre += 1
        if tag in BLOCK_TAGS:
            self._newline()

    def handle_startendtag(self, tag: str) -> None:
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

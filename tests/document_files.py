"""Documents of every kind `memrl ask` reads, written by the tests (import as a helper)."""

from __future__ import annotations

from pathlib import Path


def write_pdf(path: Path, pages: list[str]) -> Path:
    """A real multi-page PDF, one page per text, written by matplotlib (a dependency of
    memrl) with embedded TrueType fonts."""
    import matplotlib
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        for text in pages:
            fig = Figure(figsize=(8.27, 11.69))
            fig.text(0.08, 0.95, text, va="top", fontsize=10)
            pdf.savefig(fig)
    return path


def write_documents(folder: Path, text: str) -> dict[str, Path]:
    """`text` as a .txt, a .md, an .html and a .pdf file; {kind: path}."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = text.split("\n")
    html = ("<!DOCTYPE html><html><head><title>Notes</title><style>p{color:red}</style>"
            "<script>var x = 1 < 2;</script></head><body>"
            + "".join(f"<p>{line}</p>" for line in lines) + "</body></html>")
    return {
        "text": _write(folder / "notes.txt", text),
        "markdown": _write(folder / "notes.md", "# Notes\n\n" + text),
        "html": _write(folder / "notes.html", html),
        "pdf": write_pdf(folder / "notes.pdf", ["\n".join(lines[i:i + 20])
                                                for i in range(0, len(lines), 20)]),
    }


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path

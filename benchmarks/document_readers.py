"""Which library reads PDF and HTML for `memrl ask`: the measurement behind the choice.

PDF: the same ~44,000 words of synthetic text as multi-page PDFs from two real writers
(matplotlib, always; Ghostscript from `enscript | ps2pdf` in one and two columns, when those
programs are installed), read page by page with pypdf and with pdfminer.six (whichever are
installed). HTML: a 5.9 MB page (the same text 16 times, paragraphs, links, a script and a
style) read whole by BeautifulSoup (html.parser) and html2text, and streamed by memrl's
reader (the standard library's html.parser). Each reading runs in a fresh process; printed:
seconds, the peak of Python memory while reading (tracemalloc, in a second run: all these
readers are pure Python), words recovered, and how much of the word order survives (difflib
ratio over the first 8,000 words). Words are counted piece by piece: a reader that streams
(pypdf and pdfminer.six page by page, memrl's HTML reader) holds one piece at a time, as
`memrl ask` does.

    python benchmarks/document_readers.py
"""

from __future__ import annotations

import argparse
import html
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

READER = r'''
import difflib, sys, time, tracemalloc
lib, path, source, traced = sys.argv[1:5]
if lib == "pypdf":
    import pypdf
elif lib == "pdfminer.six":
    from pdfminer.high_level import extract_pages
    from pdfminer.layout import LTTextContainer
elif lib == "beautifulsoup4":
    from bs4 import BeautifulSoup
elif lib == "html2text":
    import html2text
else:
    from pathlib import Path
    from memrl.apps.ask.documents import html_pieces
if traced == "1":
    tracemalloc.start()
start = time.perf_counter()
if lib == "pypdf":
    pages = (p.extract_text() or "" for p in pypdf.PdfReader(path).pages)
elif lib == "pdfminer.six":
    pages = ("".join(e.get_text() for e in page if isinstance(e, LTTextContainer))
             for page in extract_pages(path))
elif lib == "beautifulsoup4":
    soup = BeautifulSoup(open(path, encoding="utf-8").read(), "html.parser")
    for tag in soup(["script", "style"]):
        tag.decompose()
    pages = [soup.get_text("\n")]
elif lib == "html2text":
    h = html2text.HTML2Text(); h.ignore_links = True; h.body_width = 0
    pages = [h.handle(open(path, encoding="utf-8").read())]
else:
    pages = html_pieces(Path(path))
words, head = 0, []
for page in pages:  # streamed readers hold one piece at a time, as memrl ask does
    words += len(page.split())
    if len(head) < 12000:
        head += page.split()
seconds = time.perf_counter() - start
extra = tracemalloc.get_traced_memory()[1] / 2**20 if traced == "1" else 0.0
want = open(source).read().split()
ratio = difflib.SequenceMatcher(None, want[:8000], head[:8000], autojunk=False).ratio()
print(f"{seconds:.2f}\t{extra:.1f}\t{words}\t{ratio:.4f}")
'''

WORDS = ("river city mountain born capital president album film writer singer university "
         "founded located between during after before team club war battle company married "
         "daughter father mother American British French German English Italian Spanish").split()
NAMES = ["Alvarez", "Brightwater", "Okonkwo", "Lindqvist", "Marchetti", "Tanaka", "Zhou"]


def paragraphs(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(700):
        sentences = []
        for _ in range(rng.randint(3, 6)):
            words = [rng.choice(WORDS + NAMES) for _ in range(rng.randint(8, 18))]
            sentences.append(" ".join(words).capitalize()
                             + (f" in {rng.randint(1800, 2024)}." if rng.random() < .5 else "."))
        out.append(" ".join(sentences))
    return out


def write_pdfs(paras: list[str], folder: Path) -> list[Path]:
    import matplotlib
    from matplotlib.backends.backend_pdf import PdfPages
    from matplotlib.figure import Figure

    lines = "\n".join("\n".join(textwrap.wrap(p, 80)) + "\n" for p in paras).splitlines()
    pdfs = [folder / "matplotlib.pdf"]
    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(pdfs[0]) as pdf:
        for i in range(0, len(lines), 55):
            fig = Figure(figsize=(8.27, 11.69))
            fig.text(0.08, 0.96, "\n".join(lines[i:i + 55]), va="top", fontsize=9)
            pdf.savefig(fig)
    if shutil.which("enscript") and shutil.which("ps2pdf"):
        wrapped = folder / "wrapped.txt"
        wrapped.write_text("\n".join(lines) + "\n")
        for name, flags in (("ghostscript.pdf", "-f Times-Roman11"),
                            ("ghostscript_2col.pdf", "-2 -r -f Times-Roman9")):
            subprocess.run(f"enscript -q -B {flags} -p - {wrapped} | ps2pdf - {folder / name}",
                           shell=True, check=True)
            pdfs.append(folder / name)
    return pdfs


def write_html(paras: list[str], path: Path, copies: int = 16) -> Path:
    parts = ["<html><head><title>T</title><style>p{color:red}</style>"
             "<script>var x = 1 < 2;</script></head><body>"]
    for r in range(copies):
        for i, p in enumerate(paras):
            if i % 50 == 0:
                parts.append(f"<h2>Section {r}.{i}</h2>")
            parts.append(f"<div class='c'><p>{html.escape(p)} <a href='/x/{i}'>link</a> "
                         "<b>bold</b></p></div>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def measure(lib: str, path: Path, source: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.run([sys.executable, "-c", READER, lib, str(path), str(source), traced],
                           capture_output=True, text=True, env=env, check=True).stdout.split()
            for traced in ("0", "1")]
    (seconds, _, words, ratio), peak = runs[0], runs[1][1]
    return f"| {lib} | {path.name} | {seconds} | {peak} | {int(words):,} | {ratio} |"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    paras = paragraphs()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = folder / "source.txt"
        source.write_text("\n\n".join(paras))
        print(f"# {' '.join([Path(sys.executable).name, *sys.argv])}")
        print(f"# source: {len(source.read_text().split()):,} words")
        print("| reader | file | seconds | peak Python memory (MiB) | words | "
              "word order (first 8,000) |")
        print("|---|---|---:|---:|---:|---:|")
        for pdf in write_pdfs(paras, folder):
            for lib, module in (("pypdf", "pypdf"), ("pdfminer.six", "pdfminer")):
                if installed(module):
                    print(measure(lib, pdf, source), flush=True)
        page = write_html(paras, folder / "page.html")
        repeated = folder / "repeated.txt"
        repeated.write_text("\n".join([source.read_text()] * 16))
        print(f"# HTML page: {page.stat().st_size / 1e6:.1f} MB")
        for lib, module in (("memrl (html.parser, streamed)", "memrl"),
                            ("beautifulsoup4", "bs4"), ("html2text", "html2text")):
            if installed(module):
                print(measure(lib, page, repeated), flush=True)


if __name__ == "__main__":
    main()

"""Every relative link of README.md and docs/ resolves (file and #anchor), and every
`docs/...` path named in the code, configs, scripts and tests exists."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """The text without code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    out = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        name = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading #{anchor} in {name}")
    return out


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    if not path.exists():
        pytest.skip(f"{path.name} does not exist")
    assert broken_links(path) == []


def test_slug_follows_github():
    assert slug("The CPU quickstart (2026-11-25, the 2-core machine)") == (
        "the-cpu-quickstart-2026-11-25-the-2-core-machine")
    assert slug("`memrl ask` and `memrl serve` on the 2-core CPU") == (
        "memrl-ask-and-memrl-serve-on-the-2-core-cpu")
    assert slug("Options: FSDP2's mixed precision, 3.5M") == "options-fsdp2s-mixed-precision-35m"


def test_links_in_code_spans_and_blocks_are_not_checked():
    text = "see `[a](missing.md)`\n```\n[b](missing.md)\n```\n[c](here.md)\n"
    assert LINK.findall(prose(text)) == ["here.md"]


def test_docs_paths_named_in_code_exist():
    """`docs/<name>.md` in a docstring, a --help text, a config comment or a script is a path a
    user will open."""
    files = [p for d in ("memrl", "benchmarks", "scripts", "configs", "tests", "examples")
             for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".sh", ".yaml", ".md"}]
    missing = set()
    for p in files:
        for name in re.findall(r"\bdocs/[\w./-]*\w\.(?:md|png)\b", p.read_text(encoding="utf-8")):
            if not (ROOT / name).exists():
                missing.add(f"{p.relative_to(ROOT)}: {name}")
    assert sorted(missing) == []

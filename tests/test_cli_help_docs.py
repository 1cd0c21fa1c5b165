"""Every docs/ file that a `memrl ... --help` names exists (issue 44)."""

from __future__ import annotations

import re
from pathlib import Path

from typing import Any

import typer

from memrl.cli import app, main

ROOT = Path(__file__).resolve().parent.parent


def _commands(command: Any, path: list[str]) -> list[list[str]]:
    out = [path]
    for name, sub in getattr(command, "commands", {}).items():
        out += _commands(sub, [*path, name])
    return out


def test_every_docs_path_named_in_a_help_exists(capsys):
    main(["--help"])  # registers every command
    capsys.readouterr()
    named = []
    for path in _commands(typer.main.get_command(app), []):
        assert main([*path, "--help"]) == 0
        flat = re.sub(r"[\s│]+", "", capsys.readouterr().out)  # rich wraps long lines
        named += [(" ".join(path), m) for m in re.findall(r"docs/[A-Za-z0-9_./-]+?\.md", flat)]
    assert ("serve", "docs/serving.md") in named  # the check sees them
    missing = [(where, doc) for where, doc in named if not (ROOT / doc).is_file()]
    assert not missing, missing

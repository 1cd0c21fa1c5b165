"""README.md is a landing page whose commands run as printed: every `memrl ...` command of its
shell blocks names a command and options that exist, and the blocks marked as run here (no
training, a tiny model) run on a CPU in a fresh directory."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from memrl.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUN_MARK = "<!-- tests/test_readme.py runs this block -->"
MAX_LINES = 120


def shell_blocks(text: str) -> list[tuple[bool, str]]:
    """(marked to run, body) of every ```bash block, in order."""
    pattern = re.compile(r"(?:^(<!--[^\n]*-->)\n)?^```(?:bash|sh|shell)\n(.*?)^```", re.M | re.S)
    return [(m.group(1) == RUN_MARK, m.group(2)) for m in pattern.finditer(text)]


def commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def memrl_args(words: list[str]) -> list[str] | None:
    """The arguments after `memrl` (leading VAR=value assignments skipped), or None."""
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    return words[1:] if words and words[0] == "memrl" else None


def test_blocks_and_commands_are_read_as_a_shell_reads_them():
    text = f"x\n```bash\nA=1 memrl eval x --n 2 \\\n    --out y  # z\nls\n```\n{RUN_MARK}\n```bash\nmemrl view r\n```\n"
    (first, a), (second, b) = shell_blocks(text)
    assert (first, second) == (False, True)
    assert [memrl_args(w) for w in commands(a)] == [["eval", "x", "--n", "2", "--out", "y"], None]
    assert commands(b) == [["memrl", "view", "r"]]


def test_the_readme_is_a_landing_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    first_memrl = text.index("\nmemrl ")
    assert "source .venv/bin/activate" in text[:first_memrl], (
        "`memrl` must be on the PATH before the README's first memrl command")


README_COMMANDS = [args for _, block in shell_blocks(README.read_text(encoding="utf-8"))
                   for words in commands(block) if (args := memrl_args(words)) is not None]


@pytest.mark.parametrize("args", README_COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_every_memrl_command_names_a_command_and_options_that_exist(args, capsys):
    """`--help` after the arguments: the command line is parsed (an unknown command or option
    is a usage error, exit 2) and nothing runs."""
    code = cli_main([*args, "--help"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Usage: memrl" in captured.out


@pytest.mark.slow
def test_the_marked_blocks_run_as_printed(tmp_path):
    """In a fresh directory (with the repository's examples/ and configs/ beside it, as in a
    clone), one bash process per block, in the README's order: later blocks use what earlier
    ones wrote."""
    blocks = [body for marked, body in shell_blocks(README.read_text(encoding="utf-8"))
              if marked]
    assert blocks, f"no block marked {RUN_MARK!r}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "memrl"  # the installed entry point, running this checkout
    shim.write_text(f'#!/bin/sh\nexport PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{ROOT}"\n'
                    f'exec {shlex.quote(sys.executable)} -m memrl "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "configs"):
        (work / name).symlink_to(ROOT / name)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    for body in blocks:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{body}\n{done.stderr[-3000:]}"
    assert (work / "runs" / "eval-tiny" / "biographies" / "results.json").is_file()
    assert (work / "runs" / "eval-mem1" / "results.json").is_file()

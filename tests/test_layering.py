"""The house rules of DESIGN.md, enforced: which package may import which, and no test or
benchmark reaching into a private name of the recipe, the actor or an engine."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "memrl"

FORBIDDEN = {
    # package: packages it must never import
    "agents": {"rl", "rewards", "eval", "tasks", "recipes"},
    "rl": {"agents", "tasks", "eval", "recipes", "inference"},
    "rewards": {"agents", "rl", "eval", "tasks", "recipes"},
    "tasks": {"eval", "recipes"},
    "inference": {"agents", "rl", "rewards", "eval", "tasks", "recipes"},
    "data": {"agents", "rl", "rewards", "eval", "tasks", "recipes", "inference"},
    "memory": {"agents", "rl", "rewards", "eval", "tasks", "recipes", "inference"},
    "eval": {"rl", "recipes"},
    "distributed": {
        "agents", "rl", "rewards", "eval", "tasks", "recipes", "inference", "data", "memory",
    },
}
ALLOWED: set[tuple[str, str]] = set()
"""(package, module) exceptions to FORBIDDEN: none. The contract between agents, tasks and
training (`memrl.trajectory`) lives outside all of them."""


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every memrl module a file imports (top level, functions, TYPE_CHECKING blocks)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("memrl")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("memrl"):
                out.append((node.lineno, node.module))
    return out


def violations() -> list[str]:
    found = []
    for package, banned in FORBIDDEN.items():
        for path in sorted((PACKAGE / package).rglob("*.py")):
            for line, module in imports_of(path):
                parts = module.split(".")
                if len(parts) > 1 and parts[1] in banned and (package, module) not in ALLOWED:
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def test_no_package_imports_what_it_must_not():
    assert violations() == []


def test_the_trajectory_contract_imports_no_memrl_module():
    """`memrl.trajectory` is what agents, tasks and rl share: it depends on none of them."""
    assert imports_of(PACKAGE / "trajectory.py") == []


def test_the_checker_finds_a_forbidden_import(tmp_path, monkeypatch):
    """The rule is live: an agent module importing rewards is reported."""
    fake = tmp_path / "memrl" / "agents"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from memrl.rewards.qa import extract_boxed\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "memrl")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert violations() == ["memrl/agents/bad.py:1 imports memrl.rewards.qa"]


PRIVATE_ATTR = re.compile(r"\b(run|actor|reference|engine|generator|recipe|grpo)\.(_[a-z]\w*)")
PRIVATE_IMPORT = re.compile(r"from memrl\.(recipes|rl\.actor|inference)[\w.]* import .*\b_[a-z]")


@pytest.mark.parametrize("folder", ["tests", "benchmarks"])
def test_tests_and_benchmarks_use_public_names_only(folder):
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PRIVATE_ATTR.search(line) or PRIVATE_IMPORT.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert bad == []


def test_no_function_over_100_lines_and_no_module_over_600():
    """Sizes that keep every piece readable alone (issue: one step of architecture)."""
    long_functions, long_modules = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 600:
            long_modules.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = node.end_lineno - node.lineno + 1
                if size > 100:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} "
                                          f"{node.name}: {size} lines")
    assert long_modules == [] and long_functions == []

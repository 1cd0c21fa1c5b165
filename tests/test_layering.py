"""The house rules of DESIGN.md, enforced: which package may import which (every package of
memrl is ruled, the core never imports the apps), the apps and benchmarks on public names
only, no test or benchmark reaching into a private name of the recipe, the actor or an
engine, and the size limits of memrl/ and benchmarks/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "memrl"

APPS_AND_CLI = {"apps", "cli"}
"""What no part of the core imports: the applications (`memrl.apps`) and the commands
(`memrl.cli`) are built on the core, never the reverse."""

FORBIDDEN = {
    # package: packages it must never import
    "agents": {"rl", "run", "rewards", "eval", "tasks", "recipes"} | APPS_AND_CLI,
    "rl": {"agents", "tasks", "eval", "recipes", "inference", "run"} | APPS_AND_CLI,
    "run": {"agents", "rewards", "tasks", "eval", "recipes", "inference", "memory", "models"}
    | APPS_AND_CLI,
    "rewards": {"agents", "rl", "run", "eval", "tasks", "recipes"} | APPS_AND_CLI,
    "tasks": {"eval", "recipes"} | APPS_AND_CLI,
    "inference": {"agents", "rl", "run", "rewards", "eval", "tasks", "recipes"} | APPS_AND_CLI,
    "data": {"agents", "rl", "run", "rewards", "eval", "tasks", "recipes", "inference"}
    | APPS_AND_CLI,
    "memory": {"agents", "rl", "run", "rewards", "eval", "tasks", "recipes", "inference"}
    | APPS_AND_CLI,
    "eval": {"rl", "recipes"} | APPS_AND_CLI,
    "distributed": {
        "agents", "rl", "run", "rewards", "eval", "tasks", "recipes", "inference", "data",
        "memory",
    } | APPS_AND_CLI,
    "models": APPS_AND_CLI,
    "recipes": APPS_AND_CLI,
    "apps": {"cli"},  # ask, serve, view, quickstart: the core, through public names only
    "cli": set(),  # the commands: thin wrappers over the core and the apps
}
"""Every package of memrl/ and what it must never import: a package missing here fails
`test_every_package_is_ruled`."""
ENTRY_POINTS = {"__main__"}
"""Top-level modules that may import the commands; every other module of memrl/ (config,
errors, trajectory, ...) is core."""
ALLOWED: set[tuple[str, str]] = {("run", "memrl.eval.resume")}
"""(package, module) exceptions to FORBIDDEN. One: the training trajectory log writes its
rows with the evaluation's text encoding (`memrl.eval.resume.encode_text`: lone surrogates
escaped), so both kinds of trajectory file read alike; `memrl.eval.resume` imports only
`memrl.errors` and `memrl.fileio`. The contract between agents, tasks and training
(`memrl.trajectory`) lives outside all of them."""

ROOMS = {
    # a room of memrl.rl: the only memrl modules it may import (itself included)
    "rl/maths": ("memrl.errors", "memrl.trajectory", "memrl.rl.maths"),
    "rl/trainer": ("memrl.errors", "memrl.trajectory", "memrl.distributed",
                   "memrl.models.attention", "memrl.rl.maths", "memrl.rl.config",
                   "memrl.rl.trainer"),
    "rl/config.py": ("memrl.config",),
}
"""The rooms of `memrl.rl` (the third room, run infrastructure, is the package `memrl.run`,
ruled by FORBIDDEN): the maths is pure (no process group, no model, no trainer), the trainer
builds on the maths and never reaches the run infrastructure or a recipe."""
NO_PROCESS_GROUP = ("rl/maths",)
"""Rooms that never import torch.distributed: a reduction over ranks is a function they are
given (`gae.AllReduceSum`, `correction.Gatherer`)."""


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
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem not in ENTRY_POINTS:
            found += [f"{path.relative_to(ROOT)}:{line} imports {module}"
                      for line, module in imports_of(path)
                      if module.split(".")[1:2] and module.split(".")[1] in APPS_AND_CLI]
    return found


def every_import(path: Path) -> list[tuple[int, str]]:
    """Every absolute import of a file, memrl's or not (`from x import y` as `x`)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def room_violations() -> list[str]:
    """Imports of a room of memrl.rl outside what ROOMS lets it import, and torch.distributed
    in a room of NO_PROCESS_GROUP."""
    found = []
    for room, allowed in ROOMS.items():
        where = PACKAGE / room
        for path in sorted(where.rglob("*.py") if where.is_dir() else [where]):
            for line, module in every_import(path):
                if (module.startswith("memrl") and not within(module, allowed)) or (
                        room in NO_PROCESS_GROUP and within(module, ("torch.distributed",))):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def checkpoint_reached_into() -> list[str]:
    """Modules of memrl/ outside `memrl.run` that import a module inside the checkpoint
    package instead of its public entry point, `memrl.run.checkpoint`."""
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for path in sorted(PACKAGE.rglob("*.py"))
            if (PACKAGE / "run") not in path.parents
            for line, module in imports_of(path)
            if module.startswith("memrl.run.checkpoint.")]


def unruled_packages() -> list[str]:
    """Packages of memrl/ that FORBIDDEN does not name."""
    return sorted(d.name for d in PACKAGE.iterdir()
                  if (d / "__init__.py").is_file() and d.name not in FORBIDDEN)


def test_no_package_imports_what_it_must_not():
    assert violations() == []


def test_the_rooms_of_rl_import_what_they_may():
    """maths: pure (errors, trajectory, itself; no process group); trainer: the maths, the
    configs, the process group, attention kernels; never the run infrastructure."""
    assert room_violations() == []
    assert all((PACKAGE / room).exists() for room in ROOMS)


def test_the_checkpoint_package_is_reached_through_its_entry_point():
    assert checkpoint_reached_into() == []


def test_the_room_checker_finds_a_trainer_import_in_the_maths(tmp_path, monkeypatch):
    """The rule is live: the maths importing the trainer, the process group (memrl's or
    torch's) or a model is reported; the trainer importing the run infrastructure too."""
    maths = tmp_path / "memrl" / "rl" / "maths"
    maths.mkdir(parents=True)
    (maths / "bad.py").write_text("from memrl.rl.trainer.actor import Actor\n"
                                  "import torch.distributed as tdist\n"
                                  "from memrl.distributed import Dist\n"
                                  "from memrl.rl.maths.losses import agg_loss\n")
    (tmp_path / "memrl" / "rl" / "trainer").mkdir()
    (tmp_path / "memrl" / "rl" / "trainer" / "bad.py").write_text(
        "from memrl.run.metrics import MetricsLogger\nimport torch.distributed\n")
    (tmp_path / "memrl" / "rl" / "config.py").write_text("from memrl.config import x\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "memrl")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert room_violations() == [
        "memrl/rl/maths/bad.py:1 imports memrl.rl.trainer.actor",
        "memrl/rl/maths/bad.py:2 imports torch.distributed",
        "memrl/rl/maths/bad.py:3 imports memrl.distributed",
        "memrl/rl/trainer/bad.py:1 imports memrl.run.metrics",
    ]


def test_every_package_is_ruled():
    """A new package of memrl/ says what it must never import (FORBIDDEN), and no rule names
    a package that is gone."""
    assert unruled_packages() == []
    assert sorted(p for p in FORBIDDEN if not (PACKAGE / p / "__init__.py").is_file()) == []


def test_the_core_never_imports_the_apps_and_the_apps_use_the_core():
    """The apps import the core (they are built on it); the core reaches no app: the rule
    of FORBIDDEN, seen from the apps' side."""
    core = set(FORBIDDEN) - APPS_AND_CLI
    used = {module.split(".")[1] for path in (PACKAGE / "apps").rglob("*.py")
            for _, module in imports_of(path) if module.count(".")}
    assert {"agents", "inference", "recipes"} <= used & core
    assert all(APPS_AND_CLI <= FORBIDDEN[p] for p in core)


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


def test_the_checker_finds_the_core_importing_an_app_and_an_unruled_package(tmp_path,
                                                                            monkeypatch):
    (tmp_path / "memrl" / "rl").mkdir(parents=True)
    (tmp_path / "memrl" / "rl" / "bad.py").write_text("import memrl.apps.ask\n")
    (tmp_path / "memrl" / "errors.py").write_text("from memrl.cli import main\n")
    (tmp_path / "memrl" / "__main__.py").write_text("from memrl.cli import main\n")
    (tmp_path / "memrl" / "newpkg").mkdir()
    (tmp_path / "memrl" / "newpkg" / "__init__.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "memrl")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert violations() == ["memrl/rl/bad.py:1 imports memrl.apps.ask",
                            "memrl/errors.py:1 imports memrl.cli"]
    assert unruled_packages() == ["newpkg"]


PRIVATE_ATTR = re.compile(r"\b(run|actor|reference|engine|generator|recipe|grpo)\.(_[a-z]\w*)")
PRIVATE_IMPORT = re.compile(
    r"from memrl\.(recipes|rl\.trainer\.actor|inference)[\w.]* import .*\b_[a-z]")


@pytest.mark.parametrize("folder", ["tests", "benchmarks"])
def test_tests_and_benchmarks_use_public_names_only(folder):
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PRIVATE_ATTR.search(line) or PRIVATE_IMPORT.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert bad == []


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_memrl_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_uses(path: Path) -> list[tuple[int, str]]:
    """Every private name of memrl that a file uses: an import of a `_name` or from a
    `_module`, or an attribute `_name` of a memrl module it imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: set[str] = set()  # local names bound to memrl modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "memrl":
                    if any(is_private(part) for part in a.name.split(".")):
                        found.append((node.lineno, a.name))
                    modules.add(a.asname or "memrl")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "memrl":
            if any(is_private(part) for part in node.module.split(".")):
                found.append((node.lineno, node.module))
            for a in node.names:
                if is_private(a.name):
                    found.append((node.lineno, f"{node.module}.{a.name}"))
                elif is_memrl_module(f"{node.module}.{a.name}"):
                    modules.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                found.append((node.lineno, ".".join([value.id, *chain])))
    return sorted(found)


@pytest.mark.parametrize("folder", ["memrl/apps", "benchmarks"])
def test_apps_and_benchmarks_use_public_names_of_memrl_only(folder):
    """The apps and the benchmarks are built on the core's public names: no `_private`
    name, no private module, no private attribute of a memrl module."""
    assert [f"{path.relative_to(ROOT)}:{line} uses {name}"
            for path in sorted((ROOT / folder).rglob("*.py"))
            for line, name in private_uses(path)] == []


def test_the_public_names_check_finds_private_uses(tmp_path):
    """The rule is live: private names imported, private modules, private attributes of
    memrl modules are reported; a class's attributes are not modules' and pass."""
    bench = tmp_path / "bench.py"
    bench.write_text("from memrl.rl.trainer import optim\n"
                     "from memrl.rl.trainer.optim import _helper, Schedule\n"
                     "import memrl.recipes.grpo as g\n"
                     "x = optim._private(Schedule) + g._step + Schedule._on_a_class\n"
                     "import memrl._hidden\n")
    assert private_uses(bench) == [(2, "memrl.rl.trainer.optim._helper"), (4, "g._step"),
                                   (4, "optim._private"), (5, "memrl._hidden")]


def long_functions(folders: tuple[str, ...] = ("memrl", "benchmarks"),
                   limit: int = 100) -> list[tuple[int, str]]:
    """(lines, "path:line name") of every function over `limit` lines, longest first."""
    found = []
    for folder in folders:
        where = ROOT / folder
        for path in sorted(where.rglob("*.py") if where.is_dir() else [where]):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    size = node.end_lineno - node.lineno + 1
                    if size > limit:
                        found.append((size, f"{path.relative_to(ROOT)}:{node.lineno} "
                                            f"{node.name}"))
    return sorted(found, reverse=True)


def test_no_function_over_100_lines_in_memrl_or_benchmarks():
    """Sizes that keep every piece readable alone: memrl/ and benchmarks/ alike. The
    longest function is reported (`-rP`), so the margin stays visible."""
    assert long_functions() == []
    size, where = long_functions(limit=0)[0]
    print(f"longest function: {where}, {size} lines")
    assert size <= 100


def test_no_function_over_80_lines_but_in_the_commands():
    """Every package of memrl/ (its top-level modules too) and benchmarks/ at the tighter
    limit: each function, `Actor.update` included, reads alone. The commands (`memrl.cli`)
    are held to 100 lines only."""
    folders = [str(path.relative_to(ROOT)) for path in sorted(PACKAGE.iterdir())
               if (path.is_dir() and path.name != "cli" and (path / "__init__.py").is_file())
               or path.suffix == ".py"]
    assert "memrl/rl" in folders and "memrl/config.py" in folders
    assert long_functions((*folders, "benchmarks"), limit=80) == []


def test_no_module_of_memrl_over_600_lines():
    long_modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").count("\n")
        if lines > 600:
            long_modules.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long_modules == []


def loops_that_train(path: Path) -> list[int]:
    """Lines of loops that call both `.backward()` and `.step()`: a training loop."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.For | ast.While | ast.AsyncFor):
            called = {n.func.attr for n in ast.walk(node)
                      if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
            if {"backward", "step"} <= called:
                found.append(node.lineno)
    return found


def test_benchmarks_train_through_memrl_never_a_loop_of_their_own():
    """Benchmarks time memrl's entry points (the recipe, `Actor.update`, the engines): a loop
    of backward passes and optimizer steps in a benchmark is a second trainer."""
    assert [f"{path.relative_to(ROOT)}:{line}"
            for path in sorted((ROOT / "benchmarks").rglob("*.py"))
            for line in loops_that_train(path)] == []

"""Old names kept for one release: Python names, config keys and CLI options.

- `moved_names(module, {"Old": "New"})` is a module `__getattr__`: `module.Old` (and
  `from module import Old`) still gives `New`, with a `DeprecationWarning`.
- `warn_renamed(old, new)` is what a renamed config key or CLI option says: one line,
  `<old> is deprecated: use <new>`, as a `MemrlDeprecationWarning` (a FutureWarning: shown
  by default, also to library users; the `memrl` command prints it as `warning: ...`).

It imports nothing of memrl, so any layer may use it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


class MemrlDeprecationWarning(FutureWarning):
    """A config key or CLI option that was renamed; the old one goes in the next release."""


def renamed_message(old: str, new: str) -> str:
    """The one line a renamed name, key or option says."""
    return f"{old} is deprecated: use {new} (the old name goes in the next release)"


def warn_renamed(old: str, new: str, *, stacklevel: int = 2) -> None:
    """Warn once (per call site and text) that `old` is now `new`."""
    warnings.warn(renamed_message(old, new), MemrlDeprecationWarning, stacklevel=stacklevel + 1)


def moved_names(module: str, renamed: dict[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `module` giving each old name of `renamed` as its new
    name (looked up in `module` when asked), with a DeprecationWarning."""
    import sys

    def __getattr__(name: str) -> Any:
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new = renamed[name]
        warnings.warn(renamed_message(f"{module}.{name}", f"{module}.{new}"),
                      DeprecationWarning, stacklevel=2)
        return getattr(sys.modules[module], new)

    return __getattr__

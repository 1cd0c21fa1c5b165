"""Errors a user can cause (a file, a config, an argument).

They are caught where the input enters and carry *where* it was wrong, so the CLI can print
one line and exit with code 2 instead of a traceback.
"""

from __future__ import annotations


class MemrlInputError(ValueError):
    """Bad user input: names what was wrong and where (file, line/row, key)."""

    def __init__(self, message: str, *, location: str | None = None) -> None:
        self.message = message
        self.location = location
        super().__init__(f"{location}: {message}" if location else message)


class InfrastructureError(RuntimeError):
    """A part of the machinery a run depends on failed (every inference server lost, a
    rollout engine that does not sample the policy): not the user's input and not a bug in
    memrl. The CLI prints it as one line, with the command that continues the run where the
    command knows one, and exits with code 1 (docs/failures.md)."""


class MissingDependencyError(ImportError):
    """An optional extra is needed for this feature but is not installed."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        self.package, self.extra, self.feature = package, extra, feature
        super().__init__(
            f"{feature} needs the '{package}' package: pip install 'memrl[{extra}]'"
        )

    def __reduce__(self) -> tuple:
        # Picklable, so that a rank of a Ray run can report it to the driver.
        return (type(self), (self.package, self.extra, self.feature))


def require(module: str, *, extra: str, feature: str):
    """Import an optional dependency lazily, or raise a clear MissingDependencyError."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(module.split(".")[0], extra, feature) from exc

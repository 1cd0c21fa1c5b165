"""`memrl` command line: thin wrappers that parse, load, and call one library function.

Errors a user can cause (MemrlInputError) are printed as one line on stderr with exit code 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

from memrl.cli.app import app
from memrl.errors import MemrlInputError, MissingDependencyError


def _quiet_library_progress_bars() -> None:
    """memrl shows its own progress; transformers' per-file bars would only add noise."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass


def _register_commands() -> None:
    # Importing the modules attaches their commands to the apps in memrl.cli.app.
    import importlib

    for name in ("prepare", "prepare_locomo", "models", "evaluate", "evaluate_locomo", "train",
                 "export", "quickstart"):
        try:
            importlib.import_module(f"memrl.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"memrl.cli.{name}":
                raise


MULTI_VALUE_OPTIONS = frozenset({"--num-docs", "--categories"})
"""Options that take several space-separated values (`--num-docs 50 100 200`)."""


def expand_multi_value_options(argv: list[str]) -> list[str]:
    """Rewrite `--opt a b c` as `--opt a --opt b --opt c`, the form typer/click accept.

    Values end at the next token that starts with `-` (negative numbers are not values here).
    """
    out: list[str] = []
    current: str | None = None
    for token in argv:
        if token.startswith("-"):
            current = token if token in MULTI_VALUE_OPTIONS else None
            if current is None:
                out.append(token)
            continue
        if current is not None:
            out.extend([current, token])
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `memrl` script; returns the process exit code."""
    _register_commands()
    _quiet_library_progress_bars()
    args = expand_multi_value_options(list(sys.argv[1:] if argv is None else argv))
    try:
        app(args=args, standalone_mode=False)
    except MemrlInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MissingDependencyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        return int(exc.code or 0)
    except Exception as exc:
        # Usage errors from typer's bundled click (bad option, missing argument) carry
        # their own message and exit code (2); show them like click would, without traceback.
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            return int(exc.exit_code)
        if type(exc).__name__ == "Abort":
            print("Aborted.", file=sys.stderr)
            return 1
        raise
    return 0



def run() -> None:
    """Console-script wrapper: exit with main()'s code."""
    sys.exit(main())

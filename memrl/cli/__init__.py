"""`memrl` command line: thin wrappers that parse, load, and call one library function.

Errors a user can cause (MemrlInputError, usage errors) are printed as one line on stderr with
exit code 2; a failure of the machinery a run depends on (InfrastructureError: every server
lost, a rollout engine that does not sample the policy) is one line with exit code 1; Ctrl-C
is one line and exit code 130; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import sys
from typing import Any

from memrl.cli.app import app
from memrl.distributed import RankFailedError
from memrl.errors import InfrastructureError, MemrlInputError, MissingDependencyError


def _quiet_library_progress_bars() -> None:
    """memrl shows its own progress; transformers' per-file bars would only add noise.
    Before transformers is imported, Hugging Face's own switch does it
    (HF_HUB_DISABLE_PROGRESS_BARS, read when transformers is imported; child processes
    inherit it; a value the user set stays), so a command that needs no model does not
    import transformers (1-2 s) just for this."""
    if "transformers" not in sys.modules:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "huggingface_hub" not in sys.modules:
            return
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass


def _register_commands() -> None:
    # Importing the modules attaches their commands to the apps in memrl.cli.app.
    import importlib

    for name in ("prepare", "prepare_locomo", "prepare_state", "models", "evaluate", "train",
                 "export", "quickstart",
                 "sft", "view", "ask", "serve"):
        try:
            importlib.import_module(f"memrl.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"memrl.cli.{name}":
                raise


def option_counts() -> dict[str, int]:
    """{`eval`: 1, `train`: ...}: the options (not `--help`) of every command, as `memrl ...
    --help` lists them; issue 45 bounds their sum (one command grammar: CONFIG + overrides,
    options only for paths and --resume)."""
    import typer

    _register_commands()
    counts: dict[str, int] = {}

    def walk(command: Any, path: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])
        if not hasattr(command, "commands"):
            counts[" ".join(path)] = sum(
                p.param_type_name == "option" and p.name != "help" for p in command.params)

    walk(typer.main.get_command(app), [])
    return counts


MULTI_VALUE_OPTIONS = frozenset({"--document"})
"""Options that take several space-separated values (`--document a.txt b.md`)."""
OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.\w+)*=")
"""A config override `key.path=value` (what ends the values of a multi-value option)."""


def expand_multi_value_options(argv: list[str]) -> list[str]:
    """Rewrite `--opt a b c` as `--opt a --opt b --opt c`, the form typer/click accept.

    Values end at the next token that starts with `-` (negative numbers are not values here),
    except `-` alone (standard input, as in `--document a.txt -`), and at a config override
    `key.path=value` (`--document a.txt memagent.chunk_size=512`; a file named like one is
    given as `./name`).
    """
    out: list[str] = []
    current: str | None = None
    for token in argv:
        if current is not None and OVERRIDE.match(token):
            current = None
        if token.startswith("-") and token != "-":
            current = token if token in MULTI_VALUE_OPTIONS else None
            if current is None:
                out.append(token)
            continue
        if current is not None:
            out.extend([current, token])
        else:
            out.append(token)
    return out


ENVIRONMENT_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.EROFS}
)
"""OSErrors that are the machine's state, not a bug: one line (naming the file) and exit 2
even where no check caught them first."""

PROG_NAME = "memrl"
"""The name error lines and usage hints use, also under `python -m memrl`."""

_invocation: list[str] = []


def command_line(*extra: str) -> str:
    """The command line being run (`memrl eval c.yaml ...`), shell-quoted, with `extra`
    arguments appended unless already there: what a failure line tells the user to run
    again."""
    args = list(_invocation) + [a for a in extra if a not in _invocation]
    return " ".join(shlex.quote(a) for a in [PROG_NAME, *args])


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `memrl` script; returns the process exit code.

    Every error a user can cause is one line on stderr, `error: <location>: <message>`, with
    exit code 2: MemrlInputError, a missing optional dependency, and click/typer usage errors
    (unknown option, bad value, missing argument; `memrl`/`memrl eval` without a command
    print the help on stdout first). Lines are scrubbed of secret environment values.
    An OSError of the machine's state (no permission, disk full, read-only file system) is
    one line naming the file, exit code 2. Ctrl-C is one line `interrupted (SIGINT) ...` and
    exit code 130 (`memrl train`, `memrl sft` and `memrl eval` say more: where they stopped,
    how to go on; SIGTERM there is 143). A failed rank of a Ray run is one line naming the
    rank, exit code 1 (its traceback is in the rank's output, above). A failure of the
    machinery (InfrastructureError) is one line, exit code 1: what failed and, for `memrl
    train` and `memrl eval`, what is kept and the command that continues (docs/failures.md).
    Anything else is a bug and keeps its traceback.
    """
    args = expand_multi_value_options(list(sys.argv[1:] if argv is None else argv))
    _invocation[:] = args
    try:
        _register_commands()
        _quiet_library_progress_bars()
        return _run(args)
    except KeyboardInterrupt:
        # A SIGINT the command did not handle itself (see memrl.interrupt for one that does).
        import signal

        from memrl.interrupt import exit_code_for, interrupt_message, print_line

        print_line(_scrub(interrupt_message(signal.SIGINT, *_interrupt_hint(args))))
        return exit_code_for(signal.SIGINT)


def _run(args: list[str]) -> int:
    """Parse `args` and run the command (click's `main` without its own error printing)."""
    import typer

    command = typer.main.get_command(app)
    try:
        with command.make_context(PROG_NAME, args) as ctx:
            command.invoke(ctx)
    except (MemrlInputError, MissingDependencyError) as exc:
        return print_error(str(exc))
    except RankFailedError as exc:  # a rank of a Ray run; its traceback was printed above
        return print_error(str(exc), code=1)
    except InfrastructureError as exc:  # servers lost, a rollout engine off the policy
        return print_error(str(exc), code=1)
    except typer.Exit as exc:  # --help, typer.Exit(code) in a command
        return int(exc.exit_code)
    except typer.Abort:
        print_error("aborted")
        return 1
    except typer.TyperException as exc:  # click's UsageError, BadParameter, NoSuchOption, ...
        return _usage_error(exc, args)
    except BrokenPipeError:  # `memrl ... | head`: the reader left; nothing to report
        _silence_stdout()
        return 1
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            raise
        # No permission, a full disk, a read-only file system: the user's to fix, not a bug.
        where = f"{exc.filename}: " if exc.filename else ""
        return print_error(f"{where}{exc.strerror or os.strerror(exc.errno)}")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        return print_error(str(exc.code), code=1)
    return 0


def one_line(text: str) -> str:
    """`text` with its line breaks (and the blanks around them) folded into single spaces."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip()


def _scrub(text: str) -> str:
    from memrl.run.metrics import scrub_env_secrets

    return scrub_env_secrets(text)


def print_error(message: str, *, code: int = 2) -> int:
    """Print `error: <message>` as one scrubbed line on stderr; return `code`."""
    from memrl.interrupt import print_line

    print_line(f"error: {_scrub(one_line(message)) or 'unknown error'}")
    return code


def _usage_error(exc: Exception, args: list[str]) -> int:
    """One line for a click/typer usage error: `error: memrl eval: <what>; <hint>`."""
    ctx = getattr(exc, "ctx", None)
    location = ctx.command_path if ctx is not None else _command_path(args)
    code = int(getattr(exc, "exit_code", 2) or 2)
    if any(c.__name__ == "NoArgsIsHelpError" for c in type(exc).__mro__):
        # The help was asked for implicitly; typer's rich help is already on stdout.
        help_text = exc.format_message()  # type: ignore[attr-defined]
        if help_text.strip():
            print(help_text)
        what = "missing command" if getattr(ctx, "command", None) is not None and hasattr(
            ctx.command, "commands") else "missing arguments"
        return print_error(f"{location}: {what} (see the help above)", code=code)
    message = one_line(exc.format_message()).rstrip(".")  # type: ignore[attr-defined]
    return print_error(f"{location}: {message}; see '{location} --help'", code=code)


def _command_path(args: list[str]) -> str:
    """`memrl prepare ruler-hqa`: the command names at the start of `args` (no parsing)."""
    import typer

    node: Any = typer.main.get_command(app)
    path = [PROG_NAME]
    for token in args:
        commands = getattr(node, "commands", None)
        if not commands or token not in commands:
            break
        path.append(token)
        node = commands[token]
    return " ".join(path)


def _interrupt_hint(args: list[str]) -> tuple[str, str]:
    """(where, how to continue) for an interrupted command line."""
    name = _command_path(args)
    if name in (f"{PROG_NAME} train", f"{PROG_NAME} sft"):
        how = "run it again with --resume to continue from the last checkpoint"
    elif name == f"{PROG_NAME} quickstart":
        how = "run the same command again to continue where it stopped (--fresh starts over)"
    elif name == f"{PROG_NAME} eval":
        how = "run the same command again to continue (finished episodes are kept)"
    else:
        how = "run the command again to redo it"
    return f"in '{name}'", how


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (captured output)
        pass


def run() -> None:
    """Console-script wrapper: exit with main()'s code."""
    sys.exit(main())

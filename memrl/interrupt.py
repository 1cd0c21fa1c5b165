"""Ctrl-C and `kill` as a clean exit: one line on stderr, exit code 130 (SIGINT) or 143 (SIGTERM).

    with exit_on_signals("at step 12 of training", "rerun with --resume to continue"):
        long_running_work()

On the first SIGINT or SIGTERM inside the block the handler prints, once,

    interrupted (SIGINT) at step 12 of training; rerun with --resume to continue

and raises `Interrupted`, a `SystemExit` with code 128 + signal number (130 / 143, what a
shell reports for a process killed by that signal). Being a SystemExit, it unwinds through
`finally` blocks and context managers (files are closed, temp files removed) but not through
`except Exception`, and ends the process without a traceback. A second signal during that
cleanup raises again, without a second message, so a stuck cleanup can still be stopped.
The previous handlers are restored when the block exits, however it exits.

`where` and `how` may also be functions of no argument, called when the signal arrives, for
a message that says how far the work got (`memrl train` names the step and the checkpoint).
`on_signal(signum)`, if given, is asked first: it may say something else (or nothing) and
return the exit code to use instead; None keeps the message. `memrl train` on several ranks
uses it to report a lost peer instead (torchrun's SIGTERM after a rank died is no
interruption), and to let only the main rank say "interrupted".

Signal handlers can only be installed from the main thread; elsewhere the block does nothing.
`memrl train`, `memrl sft` and `memrl eval ...` run inside such a block (and inside a run
record, `memrl.run.record`, which notes the signal); `memrl.cli.main` maps a bare
KeyboardInterrupt of any other command to the same message and exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import IO, Any

DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Text = str | Callable[[], str]
"""A message part: fixed text, or a function that says it when the signal arrives."""


def exit_code_for(signum: int) -> int:
    """The conventional exit status of a process stopped by `signum`: 128 + its number."""
    return 128 + int(signum)


def interrupt_message(signum: int, where: str = "", how: str = "") -> str:
    """`interrupted (SIGINT) <where>; <how to continue>`, as one line."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    text = f"interrupted ({name})"
    if where.strip():
        text += f" {where.strip()}"
    if how.strip():
        text += f"; {how.strip()}"
    return " ".join(text.split())


class Interrupted(SystemExit):
    """Raised by the handler of `exit_on_signals`; its `code` is 130 / 143 (or the one its
    `on_signal` chose)."""

    def __init__(self, signum: int, message: str, code: int | None = None) -> None:
        super().__init__(exit_code_for(signum) if code is None else code)
        self.signum = int(signum)
        self.message = message


class exit_on_signals:  # noqa: N801 - used like a function: `with exit_on_signals(...):`
    """Context manager: SIGINT/SIGTERM inside the block → one message, `Interrupted` raised.

    `where` says what was interrupted, `how` how to continue (both may be empty, or
    functions returning the text when the signal arrives). `on_signal(signum)` is asked
    first: an exit code replaces the message (it printed what it had to say), None keeps it.
    `stream` is where the message goes (default: `sys.stderr` at the time of the signal).
    After the block, `signum` is the signal that arrived first (None if none did).
    """

    def __init__(
        self,
        where: Text = "",
        how: Text = "",
        *,
        signals: Iterable[int] = DEFAULT_SIGNALS,
        stream: IO[str] | None = None,
        on_signal: Callable[[int], int | None] | None = None,
    ) -> None:
        self.where = where
        self.how = how
        self.on_signal = on_signal
        self.code: int | None = None
        self.signals = tuple(signals)
        self.stream = stream
        self.signum: int | None = None
        self._said = ""
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> exit_on_signals:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            # None means a handler installed from C; the default is the closest we can do.
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    @property
    def message(self) -> str:
        """The line printed for the signal that arrived (SIGINT's if none did)."""
        return self._said or interrupt_message(self.signum or signal.SIGINT, *self._texts())

    def _texts(self) -> tuple[str, str]:
        """`where` and `how` as text now; a function that fails gives its part up."""
        out = []
        for part in (self.where, self.how):
            if callable(part):
                try:
                    part = part()
                except Exception:  # noqa: BLE001 - a message must never stop the exit
                    part = ""
            out.append(str(part))
        return out[0], out[1]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:  # the first signal: say it, once
            self.signum = signum
            self.code = self._ask(signum)
            if self.code is None:
                self._said = interrupt_message(signum, *self._texts())
                print_line(self._said, self.stream)
        raise Interrupted(signum, self._said, self.code)

    def _ask(self, signum: int) -> int | None:
        """`on_signal`'s exit code; None (the interrupt message) if there is none or it fails."""
        if self.on_signal is None:
            return None
        try:
            return self.on_signal(signum)
        except Exception:  # noqa: BLE001 - a message must never stop the exit
            return None


REPORTED_ENV = "MEMRL_REPORTED_DIR"
"""Set by memrl's torchrun (`memrl.distributed.torchrun`) for its ranks: a rank that printed
why it ends leaves a file in that directory, so that the launcher adds nothing after it."""


def mark_reported() -> None:
    """Tell memrl's torchrun, if it launched this rank, that the rank printed why it ends."""
    where = os.environ.get(REPORTED_ENV)
    if where:
        try:
            with open(os.path.join(where, f"rank{os.environ.get('RANK', '0')}"), "a"):
                pass
        except OSError:
            pass


def print_line(message: str, stream: IO[str] | None = None) -> None:
    """Print why this process ends, as one line; safe inside a signal handler (the stream may
    be mid-write: then straight to fd 2)."""
    mark_reported()
    out = stream if stream is not None else sys.stderr
    try:
        out.write(message + "\n")
        out.flush()
    except (OSError, RuntimeError, ValueError, AttributeError):  # reentrant or closed stream
        try:
            os.write(2, (message + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

"""`python -m memrl.distributed.torchrun ARGS`: torchrun (`torch.distributed.run`, same
arguments) as memrl starts it, with one difference: when a rank fails, what the ranks printed
is all the user sees.

torchrun itself ends a failed run with a ~30-line `ChildFailedError` traceback and a table of
the failed ranks, after the one line a memrl rank prints for its failure (`error: rank 1 ...
died in step 2 (rollout): ...`), and logs each SIGTERM it sends. Here the launcher's logs stay
quiet below critical errors, and a failure ends with torchrun's exit code and nothing more,
except where no rank said why it ended: a rank that prints its one line (`memrl.interrupt.
print_line`) leaves a mark in a directory this launcher gives its ranks (`REPORTED_ENV`); with
no mark and no rank that exited by itself (a Python traceback is its own report), one line
names the lowest failed rank and the signal that killed it (the OOM killer, a SIGKILL from
outside, a crash in native code).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["exit_code", "main", "parse_args"]


LAUNCHER_STOPPED = {130, 143}
"""Exit codes of a memrl rank that torchrun stopped with SIGINT / SIGTERM once another rank
had failed (`memrl.interrupt`: 128 + the signal): a consequence, not a cause."""


def exit_code(failures: dict[int, Any], reported: bool) -> tuple[int, str | None]:
    """torchrun's exit code for the failed ranks (`ProcessFailure` by global rank) and the line
    to print (None where a rank said why it ended: `reported`, or a rank exited by itself).

    The root cause is the earliest failure that torchrun did not cause itself (ranks it
    stopped after the first failure exit 130 / 143, or die of SIGTERM), the lowest rank
    among equals."""
    if not failures:
        return 1, None

    def stopped_by_launcher(f: Any) -> bool:
        return f.exitcode in LAUNCHER_STOPPED or (f.exitcode < 0 and
                                                   f.signal_name() in ("SIGTERM", "SIGINT"))

    rank, first = min(failures.items(), key=lambda kv: (
        stopped_by_launcher(kv[1]), getattr(kv[1], "timestamp", 0), kv[0]))
    code = first.exitcode if first.exitcode > 0 else 128 - first.exitcode
    if reported or first.exitcode > 0:
        return code, None
    return code, (f"error: rank {rank} (local rank {first.local_rank}, pid {first.pid}) was "
                  f"killed by {first.signal_name()} before it could report anything (out of "
                  "memory, killed from outside, or a crash in native code)")


def parse_args(argv: Sequence[str]) -> Any:
    """torchrun's arguments, without its prefix matching: an option of the command it starts
    (`memrl eval ... --n 2`) is never taken for an abbreviation of one of torchrun's
    (`--nnodes`, `--nproc-per-node`, ...): everything after the module is the command's."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.allow_abbrev = False
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    from memrl.interrupt import REPORTED_ENV

    for name in ("torch.distributed.run", "torch.distributed.elastic",
                 "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="memrl-ranks-") as marks:
        os.environ[REPORTED_ENV] = marks  # the ranks inherit it
        try:
            run(parse_args(list(sys.argv[1:] if argv is None else argv)))
        except ChildFailedError as exc:
            code, line = exit_code(exc.failures, reported=any(Path(marks).iterdir()))
            if line:
                print(line, file=sys.stderr, flush=True)
            return code
        except SignalException as exc:  # SIGINT / SIGTERM to the launcher: ranks report it
            return 128 + int(exc.sigval)
        finally:
            os.environ.pop(REPORTED_ENV, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""All-or-nothing file writes: a reader (or a killed run) sees the old file or the new one."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from memrl.errors import MemrlInputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(
    path: str | Path,
    data: str | bytes,
    *,
    durable: bool = False,
    tmp_prefix: str | None = None,
    encoding: str = "utf-8",
) -> Path:
    """Write to a temp file beside `path`, then `os.replace` it into place.

    `data` may be text (encoded with `encoding`, newlines written as given) or bytes.
    `durable=True` also fsyncs the file and its directory, for files a crash must not lose
    (checkpoint pointers, metrics). `tmp_prefix` names the temp file so that leftovers of a
    crash can be recognised and cleaned.

    Like `Path.write_text`, replacing an existing file keeps its permission bits (a config
    made private with `chmod 600` stays private) and a symlink is written through: its
    target is replaced, the link stays. A new file gets the usual `0o666 & ~umask`.
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    payload = data.encode(encoding) if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    prefix = tmp_prefix if tmp_prefix is not None else f".{path.name}."
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, mode)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def write_text_atomic(
    path: str | Path, text: str, *, encoding: str = "utf-8", durable: bool = False
) -> Path:
    """Atomic drop-in for `Path(path).write_text(text, encoding=...)`; see `write_atomic`.

    For files a reader or a rerun must never see half-written: `config.yaml` of a training
    run, `results.md` of an evaluation, pointer files.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return write_atomic(path, text, encoding=encoding, durable=durable)


# ----------------------------------------------------------------------------- checking paths

MIN_FREE_BYTES = 1 << 20
"""An output location with less free space than this counts as a full disk."""


def _nearest_existing(path: Path) -> Path:
    """`path` itself if it exists, else its closest existing ancestor."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_can_create_in(directory: Path, location: str) -> None:
    """`directory` (which exists) takes new files: a directory, writable, not on a full disk."""
    if not directory.is_dir():
        raise MemrlInputError(
            f"{directory} is a file, so nothing can be created below it", location=location
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise MemrlInputError(f"{directory} is not writable (permission denied)",
                              location=location)
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    if free is not None and free < MIN_FREE_BYTES:
        raise MemrlInputError(
            f"no space left on the device of {directory} ({free} bytes free)", location=location
        )
    try:  # what os.access cannot see: read-only mounts, quotas, ACLs
        fd, probe = tempfile.mkstemp(prefix=".memrl-probe-", dir=directory)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise MemrlInputError(f"cannot write in {directory}: {reason}", location=location) \
            from None
    os.close(fd)
    Path(probe).unlink(missing_ok=True)


def check_output_dir(path: str | Path, *, location: str | None = None) -> Path:
    """Check, before any heavy work, that `path` can be (or already is) a directory we write
    into: not a file, writable, not on a full disk. Creates nothing. Problems are one-line
    `MemrlInputError`s located at `location` (default: the path)."""
    path = Path(path)
    location = location or str(path)
    if path.exists() and not path.is_dir():
        raise MemrlInputError("is a file, but a directory is needed here", location=location)
    _check_can_create_in(_nearest_existing(path), location)
    return path


def check_output_file(path: str | Path, *, location: str | None = None) -> Path:
    """Like `check_output_dir` for a file we are about to (re)write: not a directory, and its
    directory can take it."""
    path = Path(path)
    location = location or str(path)
    if path.is_dir():
        raise MemrlInputError("is a directory, but a file is needed here", location=location)
    _check_can_create_in(_nearest_existing(path.parent), location)
    return path

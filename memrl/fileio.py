"""All-or-nothing file writes: a reader (or a killed run) sees the old file or the new one."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


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

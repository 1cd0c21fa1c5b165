"""What makes an evaluation resumable and additive: episodes appended as they finish, read back
(a torn last line from a kill is dropped), and a check that a run directory belongs to the
same model, config and protocol before its episodes are reused.

    finished = read_episodes(path)                       # {(id, sample): row}
    ... run only the episodes not in `finished` ...
    append_episodes(path, rows)                          # after every batch
    check_same_run(out / "results.json", identity)       # before anything is generated

Text is written as UTF-8 with `backslashreplace`: a lone surrogate ("\\ud800", which
`json.loads` produces from a file holding that escape) inside a JSON string becomes the JSON
escape `\\ud800` again, so rows round-trip exactly and a record can never make a write fail.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError
from memrl.fileio import write_atomic

_SURROGATE = re.compile("[\ud800-\udfff]")


def encode_text(text: str) -> bytes:
    """UTF-8, with unencodable code points (lone surrogates) as `\\uXXXX` escapes."""
    return text.encode("utf-8", "backslashreplace")


def replace_surrogates(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD, so tokenizers accept it
    (a Python str can only hold surrogates unpaired: json.loads joins valid pairs)."""
    return _SURROGATE.sub("\ufffd", text)


def json_line(row: Mapping[str, Any], default: Any = None) -> bytes:
    """One JSONL line (non-ASCII kept), always encodable."""
    return encode_text(json.dumps(row, ensure_ascii=False, default=default) + "\n")


def append_episodes(path: str | Path, rows: Iterable[Mapping[str, Any]],
                    default: Any = None) -> int:
    """Append rows to a JSONL file in one `write` call, flushed to the OS; returns the count.

    A SIGKILL lands before or after the write (signals never split a Python call), so a
    killed run loses the episodes of the batch in flight, never a finished one.
    """
    lines = [json_line(row, default) for row in rows]
    if not lines:
        return 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        data = b"".join(lines)
        while data:
            written = os.write(fd, data)
            data = data[written:]
    finally:
        os.close(fd)
    return len(lines)


def read_episodes(path: str | Path, key_fields: tuple[str, ...] = ("id", "sample_index")
                  ) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The finished episodes of a trajectories file, keyed by `key_fields` (later rows win).

    Lines that do not parse as a JSON object holding the key fields (the torn tail of a
    killed write) are dropped and the file is rewritten without them, so that the next
    append starts on a fresh line. A missing file is an empty run.
    """
    path = Path(path)
    if not path.is_file():
        return {}
    raw = path.read_bytes()
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    bad = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            bad += 1
            continue
        if not isinstance(row, dict) or any(k not in row for k in key_fields):
            bad += 1
            continue
        rows[tuple(row[k] for k in key_fields)] = row
    if bad or (raw and not raw.endswith(b"\n")):
        write_atomic(path, b"".join(json_line(r) for r in rows.values()))
    return rows


RUN_IDENTITY = ("benchmark", "model", "protocol", "config")
"""The results.json keys that must match for a run directory's episodes to be reused."""


def check_same_run(results_path: str | Path, identity: Mapping[str, Any]) -> dict[str, Any]:
    """The results already in `results_path` (empty when there are none), after checking
    that they were written by the same benchmark, model, protocol and config as `identity`.

    A difference is a one-line MemrlInputError naming the first differing key (for the
    config, the first differing field) and the directory.
    """
    path = Path(results_path)
    if not path.is_file():
        return {}
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MemrlInputError(f"cannot read the previous results ({exc}); use a new --out",
                              location=str(path)) from None
    if not isinstance(previous, dict):
        raise MemrlInputError("not a memrl results file; use a new --out", location=str(path))
    for key in RUN_IDENTITY:
        mine = json.loads(json.dumps(identity.get(key), default=str))
        theirs = previous.get(key)
        if key == "protocol" and theirs is None and previous.get("benchmark") == "ruler_hqa":
            theirs = "memagent-boxed"  # runs written before protocols existed
        if mine == theirs:
            continue
        what = key
        if isinstance(mine, dict) and isinstance(theirs, dict):
            diff = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            if diff:
                field = diff[0]
                what = f"config.{field} ({theirs.get(field)!r} there, {mine.get(field)!r} now)"
        else:
            what = f"{key} ({theirs!r} there, {mine!r} now)"
        raise MemrlInputError(
            f"this run directory was written with a different {what}; its episodes cannot "
            "be reused: use a new --out or the same settings",
            location=str(path.parent),
        )
    return previous

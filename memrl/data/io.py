"""Reading and writing the JSON / JSONL files every loader shares.

Reading turns every way a file can be broken (missing, empty, not UTF-8, not JSON, nested too
deep) into a MemrlInputError that names the file and line, so loaders only check fields.
Writing is atomic (temp file + rename) so an interrupted `prepare` never leaves a half file
that a later run would read as complete.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memrl.data.records import QARecord
from memrl.errors import MemrlInputError
from memrl.fileio import write_atomic

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
}


def type_name(value: Any) -> str:
    """JSON-flavoured name of a value's type, for error messages."""
    if value is None:
        return "null"
    for t, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"),
                    (str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, t):
            return name
    return type(value).__name__


def _check_file(path: Path) -> None:
    if not path.exists():
        raise MemrlInputError("file not found", location=str(path))
    if not path.is_file():
        raise MemrlInputError("not a file", location=str(path))


def _read_text(path: Path) -> str:
    _check_file(path)
    try:
        data = path.read_bytes()
    except OSError as exc:  # permissions, I/O errors
        reason = exc.strerror or type(exc).__name__
        raise MemrlInputError(f"cannot read it: {reason}", location=str(path)) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise MemrlInputError(
            f"not valid UTF-8 text (byte {exc.start})", location=f"{path}:{line}"
        ) from None


def _loads(text: str, location: str, *, add_line: bool) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        loc = f"{location}:{exc.lineno}" if add_line else location
        message = f"invalid JSON: {exc.msg} (column {exc.colno})"
        raise MemrlInputError(message, location=loc) from None
    except RecursionError:
        raise MemrlInputError("invalid JSON: nested too deeply", location=location) from None


def read_json(path: str | Path) -> Any:
    """Parse one JSON document; errors name the file and the line of the syntax error."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise MemrlInputError("file is empty", location=str(path))
    return _loads(text, str(path), add_line=True)


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """Yield `(line_number, value)` for each non-blank line (1-based line numbers).

    An empty file (no non-blank line) is an error: it is almost always a failed earlier step.
    """
    path = Path(path)
    text = _read_text(path)
    seen = False
    # split on "\n" only: str.splitlines would also cut at U+2028 etc., legal inside JSON strings
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        seen = True
        yield lineno, _loads(line, f"{path}:{lineno}", add_line=False)
    if not seen:
        raise MemrlInputError("file is empty", location=str(path))


def first_jsonl_value(path: str | Path) -> Any:
    """The first non-blank line of a JSONL file, parsed (to sniff its format)."""
    for _, value in iter_jsonl(path):
        return value
    raise AssertionError("unreachable: iter_jsonl raises on empty files")


# ---------------------------------------------------------------------------------------------
# field access with located errors


def expect_list(value: Any, location: str, items: str, kind: str = "") -> list[Any]:
    """Check that a file's parsed JSON is a non-empty list of `items` (`kind`, when given,
    names them in full in the first error: "HotpotQA questions")."""
    if not isinstance(value, list):
        raise MemrlInputError(f"expected a JSON list of {kind or items}, got {type_name(value)}",
                              location=location)
    if not value:
        raise MemrlInputError(f"file has no {items} (empty list)", location=location)
    return value


def expect_object(value: Any, location: str, what: str = "record") -> Mapping[str, Any]:
    """Check that a parsed value is a JSON object."""
    if not isinstance(value, dict):
        raise MemrlInputError(f"{what} must be a JSON object, got {type_name(value)}",
                              location=location)
    return value


def get_field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], location: str,
              *, required: bool = True, prefix: str = "") -> Any:
    """`obj[key]` checked to be of `kind`; a missing / null optional field returns None.

    `bool` is never accepted where an int is expected (JSON true is not a count).
    """
    name = f"{prefix}{key}"
    if key not in obj or (obj[key] is None and not required):
        if required:
            raise MemrlInputError(f"missing field '{name}'", location=location)
        return None
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise MemrlInputError(
            f"field '{name}' must be {wanted}, got {type_name(value)}", location=location
        )
    return value


def get_string(obj: Mapping[str, Any], key: str, location: str, *, prefix: str = "",
               non_empty: bool = True) -> str:
    """A required string field, by default non-blank."""
    value = get_field(obj, key, str, location, prefix=prefix)
    if non_empty and not value.strip():
        raise MemrlInputError(f"field '{prefix}{key}' is empty", location=location)
    return value


def get_id(obj: Mapping[str, Any], key: str, location: str, *, prefix: str = "") -> str:
    """An identifier field: a non-empty string or an integer, returned as a string."""
    value = get_field(obj, key, (str, int), location, prefix=prefix)
    text = str(value)
    if not text.strip():
        raise MemrlInputError(f"field '{prefix}{key}' is empty", location=location)
    return text


def string_list(value: Any, name: str, location: str) -> list[str]:
    """Check a list of strings (error names the first bad element)."""
    if not isinstance(value, list):
        raise MemrlInputError(f"field '{name}' must be a list, got {type_name(value)}",
                              location=location)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise MemrlInputError(
                f"field '{name}[{i}]' must be a string, got {type_name(item)}", location=location
            )
    return value


def clean_answers(answers: Iterable[str], name: str, location: str) -> list[str]:
    """Drop blank answers and duplicates (order kept); error when nothing is left."""
    out: list[str] = []
    for a in answers:
        if a.strip() and a not in out:
            out.append(a)
    if not out:
        raise MemrlInputError(f"field '{name}' has no non-empty answer", location=location)
    return out


def make_record(location: str, **fields: Any) -> QARecord:
    """Build a QARecord, turning a pydantic ValidationError into a located MemrlInputError."""
    try:
        return QARecord(**fields)
    except ValidationError as exc:
        raise MemrlInputError(validation_message(exc), location=location) from None


def validation_message(exc: ValidationError) -> str:
    """First pydantic error as `field 'a.b': message` (one line, for the CLI)."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field '{field}': {err['msg']}{more}" if field else f"{err['msg']}{more}"


def check_unique_ids(records: Sequence[QARecord], locations: Sequence[str]) -> list[QARecord]:
    """Reject duplicate question ids: GRPO groups and result files are keyed by them."""
    seen: dict[str, str] = {}
    for record, location in zip(records, locations, strict=True):
        if record.id in seen:
            raise MemrlInputError(
                f"duplicate question id '{record.id}' (first seen at {seen[record.id]})",
                location=location,
            )
        seen[record.id] = location
    return list(records)


# ---------------------------------------------------------------------------------------------
# atomic writing


def dumps_line(value: Any) -> str:
    """One JSONL line. ASCII-escaped so any Python string (even lone surrogates) round-trips."""
    return json.dumps(value, ensure_ascii=True)


def write_jsonl_atomic(path: str | Path, rows: Iterable[Any]) -> Path:
    """Write one JSON value per line, atomically."""
    return write_atomic(path, "".join(dumps_line(r) + "\n" for r in rows))


def write_json_atomic(path: str | Path, value: Any, *, indent: int | None = None) -> Path:
    """Write one JSON document, atomically (ASCII-escaped, trailing newline)."""
    return write_atomic(path, json.dumps(value, ensure_ascii=True, indent=indent) + "\n")

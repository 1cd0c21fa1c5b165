"""Typed configs from YAML plus dotted command-line overrides (`rollout.n=16`).

Configs are pydantic models with `extra="forbid"`, so an unknown or misspelled key is an
error that names the key, never a silently ignored setting.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from memrl.errors import MemrlInputError

T = TypeVar("T", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, values are validated on set;
    each field's docstring is its description (`model_fields[name].description`), which
    docs/configuration.md is generated from."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True,
                              use_attribute_docstrings=True)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping that repeats a key (YAML forbids it; PyYAML keeps the last silently)."""

    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark) -> None:
        self.key = key
        self.first_line = first.line + 1
        self.again_line = again.line + 1
        super().__init__(
            problem=f"duplicate key {key!r} (first at line {self.first_line}, again at line "
            f"{self.again_line})",
            problem_mark=again,
        )


_MERGE_TAG = "tag:yaml.org,2002:merge"
_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictSafeLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """`yaml.SafeLoader` (the C parser when available) that rejects duplicate mapping keys.

    Each mapping's keys are checked against a dict while the mapping is constructed, so the
    check is linear in the document's size. Keys are compared after construction (`1` and
    `0x1`, `yes` and `true` are the same key). Merge keys (`<<: *base`) are not duplicates:
    keys they bring in may be overridden by the mapping's own keys, as YAML intends.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # unhashable key: the base class reports it
                    continue
                if first is not key_node:
                    raise DuplicateKeyError(key, first.start_mark, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def yaml_load_strict(text: str) -> Any:
    """Parse one YAML document safely; a repeated mapping key raises DuplicateKeyError."""
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass


def _read_text(p: Path) -> str:
    """A config file's text: unreadable, binary or non-UTF-8 files are one-line errors."""
    if not p.exists():
        raise MemrlInputError("config file not found", location=str(p))
    if not p.is_file():
        raise MemrlInputError("config path is not a file", location=str(p))
    try:
        data = p.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise MemrlInputError(f"cannot read config file: {reason}", location=str(p)) from None
    if b"\x00" in data:
        raise MemrlInputError(
            "binary file (contains NUL bytes), not YAML; a config must be UTF-8 text",
            location=str(p),
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise MemrlInputError(
            f"not valid UTF-8 text (byte {exc.start}); a config must be UTF-8 YAML",
            location=f"{p}:{line}",
        ) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; every way the file can be wrong is a one-line MemrlInputError.

    Missing, unreadable (permissions), binary and non-UTF-8 files name the file (and the
    line of the first bad byte); syntax errors and repeated keys name the file and line, a
    repeated key also the line of its first occurrence; a document that is not a mapping
    names the file.
    """
    p = Path(path)
    text = _read_text(p)
    try:
        data = yaml_load_strict(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f"{p}:{mark.line + 1}"
        elif isinstance(getattr(exc, "position", None), int):  # yaml.ReaderError
            line = text.count("\n", 0, exc.position) + 1
            where = f"{p}:{line}"
        else:
            where = str(p)
        if isinstance(exc, DuplicateKeyError):
            raise MemrlInputError(str(exc.problem), location=where) from None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MemrlInputError(f"invalid YAML: {problem}", location=where) from None
    except RecursionError:
        raise MemrlInputError("invalid YAML: nested too deeply", location=str(p)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MemrlInputError(
            f"a config must be a mapping of keys, got {type(data).__name__}", location=str(p)
        )
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (["a", "b", "c"], value); the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise MemrlInputError(f"override {text!r} is not of the form key.path=value")
    parts = key.strip().split(".")
    if any(not part for part in parts):
        raise MemrlInputError(f"override {text!r} has an empty key segment")
    try:
        value = yaml_load_strict(raw) if raw.strip() else ""
    except DuplicateKeyError as exc:
        raise MemrlInputError(f"override {text!r}: {exc.problem}") from None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `key.path=value` set (creating sections as needed)."""
    import copy

    out = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise MemrlInputError(f"override {text!r}: {where} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def located_error(model: str, key: str, message: str, value: Any) -> ValidationError:
    """A validation error of the dotted `key` of `model` (validate_config prints `key:
    message`), to raise from a validator that sees more than one field."""
    return ValidationError.from_exception_data(model, [
        {"type": PydanticCustomError("config", message), "loc": tuple(key.split(".")),
         "input": value}])


def validate_config(model: type[T], data: dict[str, Any], *, source: str = "config") -> T:
    """Build `model` from a dict; every validation problem is reported with its dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _input_error(exc, source, model) from None


def _input_error(exc: ValidationError, source: str,
                 model: type[BaseModel] | None = None) -> MemrlInputError:
    """Every problem of `exc` as `key: message`, in one line located at `source`; an unknown
    key names the closest key of its section of `model` ("did you mean ...")."""
    problems = []
    for err in exc.errors():
        key = ".".join(str(x) for x in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(model, err["loc"])
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{key}: {msg}")
    return MemrlInputError("; ".join(problems), location=source)


def _did_you_mean(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """`; did you mean x?` for the last key of `loc`, from the fields of its section (found
    by walking `model`'s nested config classes), or "" when none is close or the section is
    not a plain nested config."""
    import difflib
    import typing

    section: Any = model
    for part in loc[:-1]:
        fields = getattr(section, "model_fields", None)
        if fields is None or part not in fields:
            return ""
        candidates = [fields[part].annotation, *typing.get_args(fields[part].annotation)]
        section = next((c for c in candidates
                        if isinstance(c, type) and issubclass(c, BaseModel)), None)
    names = list(getattr(section, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.7)
    return f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?" if close else ""


def load_config(model: type[T], path: str | Path | None, overrides: list[str] = (), *,
                base: dict[str, Any] | None = None, source: str | None = None) -> T:
    """YAML file (optional) + dotted overrides → validated config of type `model`.

    `base` (without `path`): a mapping built in code in place of the file; `source` names
    where the values came from in errors (default: the file, or "overrides")."""
    if base is not None and path is not None:
        raise ValueError("load_config takes a file or a base mapping, not both")
    data = load_yaml(path) if path is not None else copy.deepcopy(base or {})
    source = source or (str(path) if path is not None else "overrides")
    data = apply_overrides(data, list(overrides))
    if overrides and path is not None:
        source += " + overrides"
    return validate_config(model, data, source=source)


def split_config_args(args: list[str] | tuple[str, ...] | None) -> tuple[Path | None, list[str]]:
    """A command's positional arguments, `[CONFIG] [key.path=value ...]`, as (the config file
    or None, the overrides): the first argument is the config file when it has no `=`; every
    other one must be an override (one-line error naming it otherwise)."""
    items = list(args or [])
    config = None
    if items and "=" not in items[0]:
        config = Path(items.pop(0))
    for item in items:
        if "=" not in item:
            raise MemrlInputError(
                f"{item!r} is not of the form key.path=value (a config file comes first, once)")
    return config, items


def load_command_config(model: type[T], args: list[str] | tuple[str, ...] | None, *,
                        base: dict[str, Any] | None = None) -> T:
    """`[CONFIG] [key.path=value ...]` of a command as a validated `model`: the file when
    given (`base`, settings the command's own options fill in, is applied under it), then
    the overrides; an unknown key or a bad value is a one-line error naming it."""
    config, overrides = split_config_args(args)
    if config is None:
        return load_config(model, None, overrides, base=base or {})
    data = apply_overrides(_deep_merge(base or {}, load_yaml(config)), overrides)
    source = str(config) + (" + overrides" if overrides else "")
    return validate_config(model, data, source=source)


def _deep_merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `under`, section by section (a copy)."""
    out = copy.deepcopy(under)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def config_to_yaml(config: BaseModel) -> str:
    """Serialise a config so that load_config() reads back the same values."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)

"""Typed configs from YAML plus dotted command-line overrides (`rl.rollout_n=16`).

Configs are pydantic models with `extra="forbid"`, so an unknown or misspelled key is an
error that names the key, never a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from memrl.errors import MemrlInputError

T = TypeVar("T", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, values are validated on set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; syntax errors and non-mapping documents name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise MemrlInputError("config file not found", location=str(p))
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MemrlInputError(f"invalid YAML: {problem}", location=where) from None
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
        value = yaml.safe_load(raw) if raw.strip() else ""
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


def validate_config(model: type[T], data: dict[str, Any], *, source: str = "config") -> T:
    """Build `model` from a dict; every validation problem is reported with its dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(x) for x in err["loc"]) or "<root>"
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{key}: {msg}")
        raise MemrlInputError("; ".join(problems), location=source) from None


def load_config(model: type[T], path: str | Path | None, overrides: list[str] = ()) -> T:
    """YAML file (optional) + dotted overrides → validated config of type `model`."""
    data = load_yaml(path) if path is not None else {}
    data = apply_overrides(data, list(overrides))
    source = str(path) if path is not None else "overrides"
    if overrides:
        source += " + overrides"
    return validate_config(model, data, source=source)


def config_to_yaml(config: BaseModel) -> str:
    """Serialise a config so that load_config() reads back the same values."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)

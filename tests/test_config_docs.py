"""docs/configuration.md is generated from the config classes' field docstrings (one source):
the committed page equals what the generator prints, and every key of a config is on it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from memrl.recipes.config_docs import render, type_name
from memrl.recipes.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
COMMAND = "python -m memrl.recipes.config_docs > docs/configuration.md"


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == render(), f"regenerate it: {COMMAND}"


def keys(cls: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in cls.model_fields.items():
        key = f"{prefix}{name}"
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += keys(field.annotation, key + ".")
        elif name != "agent_config":
            out.append(key)
    return out


def test_every_training_key_has_a_row_with_a_description():
    page = render()
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines()
            if line.startswith("| `")}
    for key in keys(TrainConfig):
        assert key in rows, key
        description = rows[key].rsplit("|", 2)[-2].strip()
        assert description, f"{key} has no docstring"


def test_type_names_are_short_and_escape_the_table_bar():
    assert type_name(int) == "int"
    assert type_name(Literal["auto", True]) == "'auto' \\| true"
    assert type_name(list[str] | None) == "list[str] \\| null"

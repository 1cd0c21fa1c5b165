"""Renamed names, config keys and CLI options still work for one release, with one warning."""

from __future__ import annotations

import importlib

import pytest

ENGINE_RENAMES = [
    ("memrl.inference", "HFGenerator", "HFEngine"),
    ("memrl.inference", "VLLMGenerator", "VLLMEngine"),
    ("memrl.inference", "OpenAIGenerator", "OpenAIEngine"),
    ("memrl.inference.hf", "HFGenerator", "HFEngine"),
    ("memrl.inference.vllm", "VLLMGenerator", "VLLMEngine"),
    ("memrl.inference.openai", "OpenAIGenerator", "OpenAIEngine"),
]


@pytest.mark.parametrize(("module", "old", "new"), ENGINE_RENAMES)
def test_old_engine_names_are_the_new_classes_with_a_deprecation_warning(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning) as caught:
        cls = getattr(mod, old)
    assert cls is getattr(mod, new)
    assert [str(w.message) for w in caught] == [
        f"{module}.{old} is deprecated: use {module}.{new} "
        "(the old name goes in the next release)"
    ]


def test_unknown_names_are_still_attribute_errors():
    mod = importlib.import_module("memrl.inference")
    with pytest.raises(AttributeError, match="NoSuchGenerator"):
        mod.NoSuchGenerator  # noqa: B018

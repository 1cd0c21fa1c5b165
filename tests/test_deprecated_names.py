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


@pytest.mark.parametrize("module", ["memrl.rl", "memrl.rl.batch"])
def test_sample_is_the_old_name_of_conversation(module):
    from memrl.rl.batch import Conversation

    with pytest.warns(DeprecationWarning, match=f"{module}.Sample is deprecated"):
        old = getattr(importlib.import_module(module), "Sample")
    assert old is Conversation


def test_rollout_batch_samples_is_the_old_name_of_conversations():
    import torch

    from memrl.rl.batch import Conversation, RolloutBatch

    turn = Conversation([1, 2], [3], [-0.5], 0, "q", 0, "final")
    batch = RolloutBatch((turn,), ("q",), torch.zeros(1), torch.ones(1, dtype=torch.long))
    with pytest.warns(DeprecationWarning, match="RolloutBatch.samples is deprecated: use "
                      "RolloutBatch.conversations"):
        assert batch.samples == batch.conversations == (turn,)

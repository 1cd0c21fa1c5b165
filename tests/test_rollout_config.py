"""The `rollout` section of the training config: engine choice and options, checked on load."""

from __future__ import annotations

import pytest

from memrl.config import load_config
from memrl.errors import MemrlInputError
from memrl.recipes.config import TrainConfig

BASE = ["model.path=m", "data.train_file=t.jsonl"]


def test_defaults_and_verl_named_options():
    cfg = load_config(TrainConfig, None, [*BASE, "rollout.engine=vllm",
                                          "rollout.vllm.gpu_memory_utilization=0.4",
                                          "rollout.vllm.tensor_model_parallel_size=2"])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm.gpu_memory_utilization == 0.4
    assert load_config(TrainConfig, None, BASE).rollout.engine == "hf"


@pytest.mark.parametrize("overrides, message", [
    (["rollout.engine=sglang"], "rollout.engine"),
    (["rollout.vllm.gpu_memory_utilization=1.5"], "gpu_memory_utilization"),
    (["rollout.vllm.enforce_eagerly=true"], "enforce_eagerly"),
    (["rollout.engine=openai"], "base_urls"),
    (["rollout.engine=openai", "rollout.openai.base_urls=[http://127.0.0.1:8000]"],
     "weights_dir"),
    (["rl.rollout_is=token", "rl.use_rollout_logprobs=true"], "use one or the other"),
])
def test_bad_rollout_settings_are_user_errors(overrides, message):
    with pytest.raises(MemrlInputError, match=message):
        load_config(TrainConfig, None, [*BASE, *overrides])

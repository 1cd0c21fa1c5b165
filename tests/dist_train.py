"""Run by the data-parallel tests under torchrun (and in-process at world size 1): train
with a task whose rollouts do not depend on how the questions are shared among ranks.

    torchrun --nproc-per-node 2 tests/dist_train.py key=value ...
    train_on_ray(config, dist_train.train_config)      # the same, on Ray Train's workers

The engine samples a whole rollout call with one seeded generator, so which questions share
a call changes the samples; rolling out each question alone, seeded by its id, makes one
process and N ranks sample exactly the same groups, so their updates can be compared.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from memrl.config import load_config
from memrl.distributed import Dist
from memrl.distributed import destroy_process_group
from memrl.inference.base import derive_seed
from memrl.recipes import grpo
from memrl.recipes.config import TrainConfig
from memrl.tasks import RolloutSpec, build_task


class PerQuestionTask:
    """The config's task, rolling out one question at a time with a seed of its own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def rollout(self, engine: Any, records: list[Any], spec: RolloutSpec) -> list[Any]:
        out: list[Any] = []
        for r in records:
            out += self.inner.rollout(engine, [r], replace(spec, seed=derive_seed(spec.seed, r.id)))
        return out


def train_config(config: TrainConfig) -> Any:
    """Train `config` with its task rolling out question by question (also one Ray rank)."""
    return grpo.train(config, task=PerQuestionTask(build_task(config)))


def fail_on_rank_1(config: TrainConfig) -> None:
    """One Ray rank: rank 1 raises while rank 0 waits for it in a collective."""
    dist = Dist.from_environment()
    if dist.rank == 1:
        raise ValueError("rank 1 gave up\nsecond line of the message")
    dist.barrier()


def train(overrides: list[str]) -> None:
    config = load_config(TrainConfig, None, overrides)
    try:
        train_config(config)
    finally:
        destroy_process_group()


def train_and_list_store(config: TrainConfig) -> list[str]:
    """One Ray rank training `config` (agent memupdate, memupdate.store: ray); returns the
    namespaces the shared store actor holds once this rank is done."""
    task = build_task(config)
    grpo.train(config, task=task)
    return sorted(task.store.backend.namespaces())


if __name__ == "__main__":
    train(sys.argv[1:])

"""Questions in, groups of scored trajectories out: the data cursor and dynamic sampling.

`collect_groups` calls a rollout function it is given (the recipe passes the task's rollout
over the engine), so `memrl.rl` knows neither the agent nor the engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.rl.maths.advantages import dynamic_sampling_keep
from memrl.trajectory import Trajectory

__all__ = ["Groups", "QuestionStream", "TrainState", "collect_groups", "informative_groups"]


@dataclass
class TrainState:
    """Everything besides tensors that a resumed run needs to continue exactly."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0
    """Position in the current epoch's shuffled order of training questions."""


class QuestionStream:
    """Training questions, shuffled per epoch by (seed, epoch), consumed with a cursor.

    The order depends only on the seed and the epoch, so a resumed run that restores
    (epoch, cursor) sees exactly the questions an uninterrupted run would.
    """

    def __init__(self, records: Sequence[Any], seed: int, shuffle: bool, state: TrainState):
        if not records:
            raise MemrlInputError("the training set is empty", location="data.train_file")
        self.records = list(records)
        self.seed = seed
        self.shuffle = shuffle
        self.state = state

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[Any]:
        out: list[Any] = []
        order = self._order(self.state.epoch)
        while len(out) < k:
            if self.state.cursor >= len(order):
                self.state.epoch += 1
                self.state.cursor = 0
                order = self._order(self.state.epoch)
            out.append(self.records[order[self.state.cursor]])
            self.state.cursor += 1
        return out


@dataclass
class Groups:
    """The scored trajectories one step trains on."""

    trajectories: list[Trajectory]
    generated: int = 0
    """Groups rolled out, including the ones dynamic sampling dropped."""
    rounds: int = 0
    seeds: list[int] = field(default_factory=list)
    """The rollout seed of each round."""
    group_order: list[str] = field(default_factory=list)
    """Every group trained on, on every rank, in the order one process would hold them."""


def informative_groups(trajectories: Sequence[Trajectory]) -> int:
    """Number of groups whose rewards are not all equal (the ones that carry a signal)."""
    by_group: dict[str, set[float]] = {}
    for t in trajectories:
        by_group.setdefault(t.record_id, set()).add(float(t.reward))
    return sum(len(v) > 1 for v in by_group.values())


# DAPO dynamic sampling with refill (arXiv:2503.14476 §3.2): roll out the next questions;
# keep the groups whose rewards are not all equal; while fewer than `want` groups are kept
# and refill rounds remain, roll out the next `want - kept` questions. If every group was
# uninformative, the last round is trained on anyway (all advantages 0: only the KL and
# entropy terms move).
def collect_groups(
    rollout: Callable[[list[Any], int], list[Trajectory]],
    stream: QuestionStream,
    *,
    want: int,
    dynamic_sampling: bool,
    max_refill_rounds: int,
    round_seed: Callable[[int], int],
    dist: Dist = Dist(),
) -> Groups:
    """`want` groups of scored trajectories; `rollout(records, seed)` samples a group per
    record, and `round_seed(r)` gives round r's seed (distinct for every round).

    Data parallelism: every rank takes the same questions from the stream (so every rank's
    cursor is the same, and a resumed run continues exactly), rolls out its share of them
    (`dist.shard`: whole groups, never split over ranks), and the keep decisions are
    gathered, so every rank agrees on the rounds, the kept groups and their order."""
    out = Groups([])
    last: list[Trajectory] = []
    last_order: list[str] = []
    rounds = 1 + (max_refill_rounds if dynamic_sampling else 0)
    for r in range(rounds):
        kept = set(out.group_order)
        need = want - len(kept)
        if need <= 0:
            break
        records = stream.take(need)
        seed = round_seed(r)
        out.generated += len(records)
        out.rounds += 1
        out.seeds.append(seed)
        mine = dist.shard(records)
        last = rollout(mine, seed) if mine else []
        keep = [True] * len(last)
        if dynamic_sampling:
            rewards = torch.tensor([float(t.reward) for t in last])
            keep = dynamic_sampling_keep(rewards, [t.record_id for t in last]).tolist()
        # A question already kept (the stream wrapped into a new epoch during refill) is not
        # kept twice: its two groups would merge into one.
        chosen = [t for t, k in zip(last, keep, strict=True) if k and t.record_id not in kept]
        out.trajectories += chosen
        if dist.world_size == 1:
            last_order = list(dict.fromkeys(t.record_id for t in last))
            out.group_order += list(dict.fromkeys(t.record_id for t in chosen))
        else:  # the records' order is the order one process would have rolled them out in
            ids = set().union(*dist.all_gather({t.record_id for t in chosen}))
            last_order = list(dict.fromkeys(x.id for x in records))
            out.group_order += [i for i in last_order if i in ids and i not in kept]
    if not out.group_order:
        out.trajectories, out.group_order = last, last_order
    return out

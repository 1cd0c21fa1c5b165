"""Who this process is among the training processes, and the one collective the recipe needs.

On a laptop there is one process (`Dist()`: rank 0 of 1, main). Under `torchrun` (or Ray
Train) `Dist.from_environment()` reads the rank and world size that the launcher set, once
torch.distributed is initialised; the recipe's code is the same either way:

    if dist.is_main: log, validate, save          # side effects on one rank only
    total = dist.all_reduce_sum(local_count)      # e.g. loss-token totals over ranks
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"bad rank {self.rank} of world size {self.world_size}")

    @property
    def is_main(self) -> bool:
        """The rank that logs, validates, plots and writes checkpoints' shared files."""
        return self.rank == 0

    @classmethod
    def from_environment(cls) -> Dist:
        """The initialised torch.distributed group's rank and size, else a single process."""
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            return cls(tdist.get_rank(), tdist.get_world_size())
        return cls()

    def all_reduce_sum(self, value: float | int | Any) -> Any:
        """The sum over ranks of a number or tensor (returned as given at world size 1)."""
        if self.world_size == 1:
            return value
        import torch
        import torch.distributed as tdist

        if isinstance(value, torch.Tensor):
            out = value.clone()
            tdist.all_reduce(out, op=tdist.ReduceOp.SUM)
            return out
        t = torch.tensor(float(value), dtype=torch.float64)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return type(value)(t.item()) if isinstance(value, int) else t.item()

    def shard(self, items: list[Any]) -> list[Any]:
        """This rank's share of `items`: every world_size-th one, starting at its rank."""
        return items[self.rank :: self.world_size]

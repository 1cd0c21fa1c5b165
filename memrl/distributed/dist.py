"""Who this process is among the training processes, and the one collective the recipe needs.

On a laptop there is one process (`Dist()`: rank 0 of 1, main). Under `torchrun` (or Ray
Train) `Dist.from_environment()` reads the rank and world size that the launcher set, once
torch.distributed is initialised; the recipe's code is the same either way:

    if dist.is_main: log, validate, save          # side effects on one rank only
    total = dist.all_reduce_sum(local_count)      # e.g. loss-token totals over ranks
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from memrl.distributed.heartbeat import collective


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
            with collective():
                tdist.all_reduce(out, op=tdist.ReduceOp.SUM)
            return out
        t = torch.tensor(float(value), dtype=torch.float64)
        with collective():
            tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        return type(value)(t.item()) if isinstance(value, int) else t.item()

    def all_reduce_max(self, value: int) -> int:
        """The largest of the ranks' `value`s (e.g. micro-batch counts they must agree on)."""
        if self.world_size == 1:
            return value
        import torch
        import torch.distributed as tdist

        t = torch.tensor(int(value), dtype=torch.int64)
        with collective():
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return int(t.item())

    def shard(self, items: list[Any]) -> list[Any]:
        """This rank's share of `items`: every world_size-th one, starting at its rank."""
        return items[self.rank :: self.world_size]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable), in rank order (`[obj]` at world size 1)."""
        if self.world_size == 1:
            return [obj]
        import torch.distributed as tdist

        out: list[Any] = [None] * self.world_size
        with collective():
            tdist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every rank gets here (nothing at world size 1)."""
        if self.world_size > 1:
            import torch.distributed as tdist

            with collective():
                tdist.barrier()

    def broadcast_(self, tensors: list[Any], bucket_numel: int = 1 << 24) -> None:
        """Copy the main rank's `tensors` into every rank's, in place (the same list, in the
        same order, on every rank; nothing at world size 1)."""
        if self.world_size == 1:
            return
        import torch.distributed as tdist

        _bucketed([t.detach() for t in tensors], lambda flat: tdist.broadcast(flat, src=0),
                  bucket_numel)

    # Data parallelism with replicated weights: every rank's loss is its exact share of the
    # global mini-batch loss (global divisors), so the global gradient is the SUM of the ranks'
    # gradients (DDP would average them). A rank with no sample in a mini-batch adds zeros.
    def sum_gradients(self, params: list[Any], bucket_numel: int = 1 << 24) -> None:
        """Replace every parameter's .grad by its sum over ranks (None counts as zeros)."""
        if self.world_size == 1:
            return
        import torch
        import torch.distributed as tdist

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        _bucketed([p.grad for p in params],
                  lambda flat: tdist.all_reduce(flat, op=tdist.ReduceOp.SUM), bucket_numel)


def _bucketed(tensors: list[Any], collective_op: Callable[[Any], Any], bucket_numel: int) -> None:
    """Run `collective_op` in place on `tensors` flattened into buckets of about
    `bucket_numel` elements (one dtype and device each, in the same order on every rank),
    then copy each bucket back into its tensors."""
    import torch

    by_kind: dict[tuple[Any, Any], list[Any]] = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    for kind in sorted(by_kind, key=str):  # the same order on every rank
        group = by_kind[kind]
        bucket: list[Any] = []
        size = 0
        for i, t in enumerate(group):
            bucket.append(t)
            size += t.numel()
            if size >= bucket_numel or i == len(group) - 1:
                flat = torch.cat([q.reshape(-1) for q in bucket])
                with collective():
                    collective_op(flat)
                offset = 0
                with torch.no_grad():
                    for q in bucket:
                        q.copy_(flat[offset : offset + q.numel()].view_as(q))
                        offset += q.numel()
                bucket, size = [], 0

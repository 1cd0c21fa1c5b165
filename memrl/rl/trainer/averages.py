"""Running averages of a training update's metrics, read from the device at once.

`RunningAverages` takes floats or one-element device tensors; `read_scalars` reads many
such tensors in one transfer per device (each separate read would wait for the GPU's queue).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from memrl.distributed import Dist

__all__ = ["RunningAverages", "read_scalars"]


def read_scalars(tensors: Sequence[Tensor]) -> list[float]:
    """The values of one-element tensors as floats (float64, exact for float32), read from
    each device in one transfer."""
    out: list[float] = [0.0] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for positions in by_device.values():
        values = torch.stack([tensors[i].detach().reshape(()).double() for i in positions])
        for i, value in zip(positions, values.cpu().tolist(), strict=True):
            out[i] = value
    return out


class RunningAverages:
    """Running averages: plain (one value per event) or weighted (e.g. by tokens).

    A value or weight may be a one-element tensor on the device: it is read with the others
    when the averages are (`flush`), in one transfer, so a micro-batch's metrics cost no
    host synchronisation (each would drain the GPU's queue). The sums are the same numbers,
    added in the same order, as with floats."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self._pending: list[tuple[str, Tensor | float, Tensor | float]] = []

    def add(self, name: str, value: Tensor | float, weight: Tensor | float = 1.0) -> None:
        if self._pending or isinstance(value, Tensor) or isinstance(weight, Tensor):
            self._pending.append((name, value, weight))  # keeps the order of the sums
        else:
            self._accumulate(name, value, weight)

    def _accumulate(self, name: str, value: float, weight: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def flush(self) -> None:
        """Read the pending tensors (one device-to-host copy) into the sums."""
        if not self._pending:
            return
        read = iter(read_scalars([x for _, v, w in self._pending for x in (v, w)
                                  if isinstance(x, Tensor)]))
        for name, value, weight in self._pending:
            self._accumulate(name, next(read) if isinstance(value, Tensor) else value,
                             next(read) if isinstance(weight, Tensor) else weight)
        self._pending.clear()

    def result(self) -> dict[str, float]:
        self.flush()
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}

    def reduced(self, dist: Dist, replicated: frozenset[str] = frozenset()) -> dict[str, float]:
        """The averages over every rank's events. Values added identically on every rank
        (`replicated`: losses, grad norms) are counted once; token-weighted ones are summed
        over ranks."""
        if dist.world_size == 1:
            return self.result()
        self.flush()
        out = RunningAverages()
        for rank, (sums, weights) in enumerate(dist.all_gather((self.sums, self.weights))):
            for k in sums:
                if k in replicated and rank > 0:
                    continue
                out.sums[k] = out.sums.get(k, 0.0) + sums[k]
                out.weights[k] = out.weights.get(k, 0.0) + weights[k]
        return out.result()

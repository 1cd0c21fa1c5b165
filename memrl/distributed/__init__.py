"""Training on many processes: who this process is, its process group, the ranks' heartbeat,
and the launchers (torchrun on one node, Ray Train on a cluster).

- `dist`: `Dist`, this process's rank among the training processes and its collectives;
- `process_group`: joining torchrun's (or Ray Train's) process group, and
  `memrl train --nproc-per-node` (torchrun started by memrl);
- `heartbeat`: whether the other ranks are alive (docs/failures.md);
- `ray`: `trainer.launcher: ray`, the recipe on Ray Train's workers.

Nothing here imports torch, or ray, until it is used.
"""

from __future__ import annotations

from memrl.distributed.dist import Dist
from memrl.distributed.heartbeat import Heartbeat, Verdict, note
from memrl.distributed.process_group import (
    NPROC_ENV,
    collective_failed,
    destroy_process_group,
    init_process_group,
    launched,
    relaunch,
    torchrun_command,
)
from memrl.distributed.ray import RankFailedError, rank_error, train_on_ray

__all__ = [
    "NPROC_ENV", "Dist", "Heartbeat", "RankFailedError", "Verdict", "collective_failed",
    "destroy_process_group", "init_process_group", "launched", "note", "rank_error", "relaunch",
    "torchrun_command", "train_on_ray",
]

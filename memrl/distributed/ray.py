"""Training on a Ray cluster: the same recipe on `trainer.ray.num_workers` ranks (Ray Train).

    memrl train CONFIG.yaml trainer.launcher=ray trainer.ray.num_workers=8 \\
        trainer.ray.gpus_per_worker=1        # on the cluster of RAY_ADDRESS / trainer.ray.address

`train_on_ray(config, train)` joins the cluster (`trainer.ray.address`, else RAY_ADDRESS, else
a local cluster it starts for the run and stops after it) and runs `train(config)` on every
rank through Ray Train's `TorchTrainer`. Ray Train starts one actor per rank, sets RANK,
WORLD_SIZE and LOCAL_RANK, and joins them in a torch.distributed group (gloo on CPU,
cpu:gloo,cuda:nccl with GPUs) whose collective timeout is `trainer.dist_timeout_s`; the recipe's
`init_process_group` then finds the group joined and `Dist.from_environment()` gives the
rank. Nothing in the recipe knows that it runs on Ray.

Each rank works in the driver's working directory when that directory exists on its node
(Ray would start it in a session directory of its own), so relative paths in the config mean
what they mean to the driver; across several machines, put data, model and out_dir on a
shared file system.

Failures. Ray Train watches the ranks: when one raises or its process dies, it stops the
others and the run fails. `train_on_ray` turns that into one error naming the lowest failed
rank: `RankFailedError` (`rank 1 failed: ValueError: ...`), or, when the rank rejected user
input (a missing data file) or lacks an extra, a MemrlInputError located at that rank. The
rank's traceback is in the output above it (Ray forwards every rank's output). A rank that
hangs is caught by the collective timeout. Failed ranks are not restarted: continue with `--resume`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memrl.distributed.process_group import BACKEND_CUDA
from memrl.errors import MemrlInputError, MissingDependencyError, require

__all__ = ["RankFailedError", "rank_error", "run_rank", "train_on_ray"]

FEATURE = "trainer.launcher: ray"


class RankFailedError(RuntimeError):
    """A rank of a Ray run failed; names it and the error, in one line."""

    def __init__(self, rank: int, error: BaseException, others: list[int] | None = None) -> None:
        self.rank = rank
        self.error = error
        text = str(error).strip().splitlines()
        message = f"rank {rank} failed: {type(error).__name__}"
        if text:
            message += f": {text[0]}"
        if others:
            message += f" (ranks {', '.join(map(str, others))} failed too)"
        super().__init__(message + "; its traceback is in the log above")


def rank_error(failures: Mapping[int, BaseException]) -> Exception:
    """The one error to raise for Ray Train's `{rank: exception}` of a failed run: the lowest
    rank's, as a MemrlInputError at `rank N` when it was bad user input or a missing extra."""
    rank = min(failures)
    error = failures[rank]
    others = sorted(r for r in failures if r != rank)
    if isinstance(error, (MemrlInputError, MissingDependencyError)):
        return MemrlInputError(str(error), location=f"rank {rank}")
    return RankFailedError(rank, error, others)


def run_rank(loop_config: dict[str, Any]) -> Any:
    """What every Ray Train worker runs: `train(config)` in the driver's working directory."""
    cwd = loop_config["cwd"]
    if os.path.isdir(cwd):
        os.chdir(cwd)
    return loop_config["train"](loop_config["config"])


def train_on_ray(config: Any, train: Callable[[Any], Any]) -> Any:
    """Run `train(config)` on the `config.trainer.ray.num_workers` ranks of a Ray Train worker
    group and return rank 0's result. `train` must be importable by the workers (a
    module-level function); `config` a picklable training config with a `trainer` section."""
    ray = require("ray", extra="ray", feature=FEATURE)
    ray_train = require("ray.train", extra="ray", feature=FEATURE)
    ray_torch = require("ray.train.torch", extra="ray", feature=FEATURE)
    trainer_cfg = config.trainer
    rc = trainer_cfg.ray
    started = False
    if not ray.is_initialized():
        address = rc.address or os.environ.get("RAY_ADDRESS") or None
        if address is None:
            check_local_gpus(rc.num_workers * rc.gpus_per_worker)
            need = math.ceil(rc.num_workers * rc.cpus_per_worker)
            ray.init(num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False)
        else:
            try:
                ray.init(address=address)
            except ConnectionError as exc:
                raise MemrlInputError(
                    f"no Ray cluster at {address!r} ({exc})", location="trainer.ray.address"
                ) from None
        started = True
    try:
        resources = {"CPU": float(rc.cpus_per_worker)}
        if rc.gpus_per_worker:
            resources["GPU"] = float(rc.gpus_per_worker)
        trainer = ray_torch.TorchTrainer(
            run_rank,
            train_loop_config={"train": train, "config": config, "cwd": os.getcwd()},
            scaling_config=ray_train.ScalingConfig(
                num_workers=rc.num_workers,
                use_gpu=rc.gpus_per_worker > 0,
                resources_per_worker=resources,
            ),
            torch_config=ray_torch.TorchConfig(
                backend=BACKEND_CUDA if rc.gpus_per_worker > 0 else "gloo",
                timeout_s=math.ceil(trainer_cfg.dist_timeout_s)),
            run_config=ray_train.RunConfig(
                storage_path=str(Path(trainer_cfg.out_dir).resolve() / "ray"),
                failure_config=ray_train.FailureConfig(max_failures=0),
            ),
        )
        try:
            result = trainer.fit()
        except ray_train.WorkerGroupError as exc:
            raise rank_error(exc.worker_failures) from None
        return result.return_value
    finally:
        if started:
            ray.shutdown()


def check_local_gpus(wanted: int) -> None:
    """MemrlInputError when a local cluster would need more GPUs than this machine has (Ray
    would wait for them forever)."""
    if wanted == 0:
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if wanted > have:
        raise MemrlInputError(
            f"{wanted} GPUs asked for (num_workers × gpus_per_worker) but this machine has "
            f"{have}; name a cluster with trainer.ray.address or RAY_ADDRESS",
            location="trainer.ray",
        )

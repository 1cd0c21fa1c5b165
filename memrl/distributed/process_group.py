"""Joining the launcher's process group, and the one-node launcher (torchrun).

    torchrun --nproc-per-node 2 -m memrl train CONFIG.yaml      any launcher that sets
                                                                RANK, WORLD_SIZE, MASTER_ADDR
    memrl train CONFIG.yaml --nproc-per-node 2                  the same on one node: memrl
                                                                starts torchrun itself

`init_process_group` is called once by the training entry point: under a launcher it joins
the group (gloo on CPU, nccl on CUDA, one GPU per process: cuda:LOCAL_RANK) with the
collective timeout of the config, and returns the `Dist` the recipe uses; without one it
returns a single process's `Dist()` and starts nothing.

Failures. Under torchrun every rank runs a heartbeat (`memrl.distributed.heartbeat`, started
here when `heartbeat_s` is given): a rank that froze or died is found within 1.2 ×
`trainer.heartbeat_timeout_s` (at once for a dead rank on the same machine), and the run ends
with one line naming it, its host and what it was doing. torchrun's agent also watches its
workers: when one dies it stops the others (SIGTERM) and exits non-zero, printing the failed
rank and its exit code or signal. A rank whose process lives but never reaches the next
collective (a deadlock) is caught by the collective timeout (`trainer.dist_timeout_s`):
`collective_failed` tells such an error apart, and the CLI names every rank's activity.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import timedelta

from memrl.distributed.dist import Dist

__all__ = [
    "NPROC_ENV", "collective_failed", "destroy_process_group", "init_process_group", "launched",
    "torchrun_command",
]

NPROC_ENV = "MEMRL_NPROC_PER_NODE"
"""Set by `memrl train --nproc-per-node N` for the ranks it starts (their resume command)."""


def launched() -> bool:
    """Whether a launcher (torchrun, Ray Train, SLURM + torchrun) started this process as one
    rank of several: WORLD_SIZE is set and above 1."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


BACKEND_CUDA = "cpu:gloo,cuda:nccl"
"""The process group's backends on GPUs: nccl for CUDA tensors, gloo for CPU ones."""


def init_process_group(
    timeout_s: float, *, device: str | None = None, always: bool = False,
    heartbeat_s: float | None = None,
) -> Dist:
    """Join the launcher's process group (once) and return this process's `Dist`.

    Without a launcher: a single process's `Dist()` and no group, unless `always` (FSDP
    needs a group even alone): then a group of one process, with no network rendezvous.

    Backend: on CUDA (`device` None or a cuda device, and CUDA is there) nccl for CUDA tensors
    and gloo for CPU ones (`cpu:gloo,cuda:nccl`: `Dist.all_reduce_sum`/`all_reduce_max`
    reduce CPU numbers, which nccl alone refuses), else gloo. On CUDA each process uses the
    GPU of its LOCAL_RANK. A collective that waits longer than `timeout_s` seconds raises on
    the waiting ranks.

    `heartbeat_s` (> 0): under torchrun, start this rank's heartbeat with that timeout
    (`memrl.distributed.heartbeat`; `destroy_process_group` stops it).
    """
    if not launched() and not always:
        return Dist()
    import torch
    import torch.distributed as tdist

    if tdist.is_initialized():
        return Dist.from_environment()
    cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    options: dict = dict(backend=BACKEND_CUDA if cuda else "gloo",
                         timeout=timedelta(seconds=float(timeout_s)))
    if not launched():
        options.update(store=tdist.HashStore(), rank=0, world_size=1)
    import_modules_that_pin_the_group()
    tdist.init_process_group(**options)
    global _joined
    _joined = True
    dist = Dist.from_environment()
    if heartbeat_s and dist.world_size > 1:
        start_heartbeat(dist, heartbeat_s)
    return dist


PINNING_MODULES = (
    "torch.distributed.nn.functional",  # transformers' modeling_utils imports it
    "torch.distributed.fsdp.sharded_grad_scaler",  # any torch.distributed.fsdp import
    "torch.distributed.optim.zero_redundancy_optimizer",
)
"""torch modules with a `group=group.WORLD` default argument, evaluated when the module is
first imported. Imported after the group is made, they hold it for the life of the process:
`destroy_process_group` cannot free it, and its gloo worker threads live on into the
interpreter's shutdown, where one that drops its last collective's tensor (which takes the
GIL) is ended by Python mid C++ and aborts the process ("terminate called without an active
exception", SIGABRT on a rank after its work: intermittent, since it races the exit).
Imported before, they hold None: the default group when called."""


def import_modules_that_pin_the_group() -> None:
    """Import `PINNING_MODULES` (before the process group exists)."""
    import importlib

    for name in PINNING_MODULES:
        importlib.import_module(name)


def start_heartbeat(dist: Dist, timeout_s: float) -> bool:
    """Start this rank's heartbeat on torchrun's store (served by its agent, so that it answers
    whichever rank froze); False, and no heartbeat, under a launcher whose store a rank serves
    (a frozen rank 0 would take the store with it: the collective timeout applies there)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False
    import torch.distributed as tdist

    from memrl.distributed import heartbeat

    try:
        store = tdist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
            timeout=timedelta(seconds=float(timeout_s)), wait_for_workers=False,
        )
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        heartbeat.start(store, dist.rank, dist.world_size, timeout_s,
                        prefix=f"{heartbeat.KEY_PREFIX}/{restart}")
    except (KeyError, ValueError, RuntimeError) as exc:  # no store to beat into: train on
        if dist.is_main:
            print(f"warning: no heartbeat between the ranks (torchrun's store at "
                  f"MASTER_ADDR:MASTER_PORT: {' '.join(str(exc).split())}); a frozen rank is "
                  "found only by trainer.dist_timeout_s", file=sys.stderr, flush=True)
        return False
    return True


COLLECTIVE_ERRORS = ("gloo", "nccl", "timed out waiting", "connection closed by peer",
                     "connection reset by peer", "broken pipe")
"""Words of the RuntimeErrors collectives raise when a peer is gone or late (gloo raises
plain RuntimeErrors; NCCL's are torch.distributed.DistError)."""


def collective_failed(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed because of a peer (gone, or too late)."""
    import torch.distributed as tdist

    if isinstance(exc, getattr(tdist, "DistError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in COLLECTIVE_ERRORS)


_joined = False
"""Whether `init_process_group` created this process's group (and so may destroy it)."""


def destroy_process_group() -> None:
    """Leave the process group, if `init_process_group` joined one. A group somebody else
    made in this process (an in-process vLLM engine makes one of its own) is left alone:
    destroying it under them breaks their next collective or their shutdown."""
    global _joined
    import torch.distributed as tdist

    from memrl.distributed import heartbeat

    heartbeat.stop()
    if _joined and tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()
    _joined = False


def torchrun_command(nproc_per_node: int, module_args: Sequence[str]) -> list[str]:
    """torchrun (`memrl.distributed.torchrun`: the ranks' own one-line errors, no launcher
    traceback after them) starting `python -m memrl <module_args>` on `nproc_per_node`
    processes of this node (a free rendezvous port, `--standalone`)."""
    return [
        sys.executable,
        "-m",
        "memrl.distributed.torchrun",
        "--standalone",
        f"--nproc-per-node={int(nproc_per_node)}",
        "-m",
        "memrl",
        *module_args,
    ]


def relaunch(nproc_per_node: int, module_args: Sequence[str]) -> int:
    """Run `memrl <module_args>` on `nproc_per_node` local processes; torchrun's exit code."""
    from pathlib import Path

    import memrl

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env[NPROC_ENV] = str(int(nproc_per_node))
    # The workers import the same memrl as this process (a source checkout included).
    root = str(Path(memrl.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return subprocess.call(torchrun_command(nproc_per_node, module_args), env=env)

"""A training run's lifecycle around the recipe, for `memrl train` and Python alike
(`launch.train(cfg)`): the output directory checked, the run record (`memrl.run.record`),
Ctrl-C / SIGTERM as one line naming the step and the last checkpoint with the command that
continues (`memrl.interrupt`), the heartbeat's epilogue and a lost rank reported as one line
(`memrl.distributed.heartbeat`), the Ray launcher, and the process group torn down.

Starting more processes of this machine (`memrl train --nproc-per-node N`) is the command's:
it starts the command line again under torchrun; each rank then calls `train` here.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def train(cfg: Any, *, how_to_continue: str | None = None, console: Any = None) -> Any:
    """Run `grpo.train(cfg)` (a TrainConfig) with its lifecycle; returns this rank's final
    state. `how_to_continue`: what an interruption or a lost server tells the user (`memrl
    train` passes its command line with --resume, `resume_command`)."""
    from rich.console import Console

    from memrl.distributed import destroy_process_group, heartbeat
    from memrl.errors import InfrastructureError
    from memrl.fileio import check_output_dir
    from memrl.interrupt import exit_on_signals
    from memrl.recipes import grpo

    on_ray = cfg.trainer.launcher == "ray"
    check_launcher(on_ray, 1)
    out_dir = Path(cfg.trainer.out_dir)
    check_output_dir(out_dir, location=f"trainer.out_dir {out_dir}")
    console = console or Console()
    if os.environ.get("RANK", "0") == "0":
        ranks = f" on {cfg.trainer.ray.num_workers} Ray workers" if on_ray else ""
        console.print(f"training → {out_dir}{ranks}")
    progress = TrainProgress(out_dir, on_ray=on_ray)
    how = how_to_continue or "continue with trainer.resume=auto (the same config)"
    heartbeat.set_epilogue(lambda: f"{progress.saved()}; {how}")
    try:
        with record_training("train", cfg, cfg.rollout.engine), \
                exit_on_signals(progress.describe, how, on_signal=rank_on_signal):
            if on_ray:
                from memrl.distributed import train_on_ray

                return train_on_ray(cfg, train_rank)
            try:
                return grpo.train(cfg, console=console, on_start=progress.started)
            except InfrastructureError as exc:
                raise InfrastructureError(f"{exc}; stopped {progress.describe()}; {how}") \
                    from exc
            except Exception as exc:
                end_if_a_rank_is_lost(exc, cfg.trainer.dist_timeout_s)
                raise
    finally:
        destroy_process_group()
        heartbeat.set_epilogue(None)


def record_training(kind: str, cfg: Any, engine: str | None) -> Any:
    """The run record (`memrl.run.record`) of a training run in `trainer.out_dir`: world size
    and launcher (Ray's ranks, or torchrun's), strategy, engine, seed, config hash."""
    from memrl.run.record import recorded

    on_ray = cfg.trainer.launcher == "ray"
    return recorded(
        cfg.trainer.out_dir, kind, config=cfg, seed=cfg.seed,
        world_size=cfg.trainer.ray.num_workers if on_ray else None,
        launcher=cfg.trainer.launcher, strategy=cfg.model.strategy, engine=engine,
        device=cfg.model.device,
    )


def train_rank(cfg: Any) -> Any:
    """One rank of a `trainer.launcher: ray` run: the recipe, printing on the main rank."""
    from rich.console import Console

    from memrl.recipes import grpo

    return grpo.train(cfg, console=Console())


def check_launcher(on_ray: bool, nproc_per_node: int) -> None:
    """MemrlInputError when two launchers are asked for at once."""
    from memrl.distributed import launched
    from memrl.errors import MemrlInputError

    if on_ray and nproc_per_node > 1:
        raise MemrlInputError(
            "starts torchrun, but trainer.launcher is ray: set the number of ranks with "
            "trainer.ray.num_workers", location="--nproc-per-node")
    if on_ray and launched():
        raise MemrlInputError(
            "is ray, but this process is already one rank of a launcher (torchrun): use "
            "trainer.launcher=local under torchrun", location="trainer.launcher")


def resume_command(config: Path, overrides: list[str], command: str = "train",
                   env: Mapping[str, str] | None = None) -> str:
    """The command line that continues this run on the same launcher and number of ranks:
    `memrl train CONFIG [OVERRIDES] --resume` (`command` sft: `memrl sft ...`), with
    `--nproc-per-node N` when memrl started torchrun, or torchrun's own command when torchrun
    started memrl (`env`: os.environ)."""
    from memrl.distributed import NPROC_ENV

    env = os.environ if env is None else env
    args = [command, str(config), *overrides]
    world = int(env.get("WORLD_SIZE") or 1)
    nodes = int(env.get("GROUP_WORLD_SIZE") or 1)
    if env.get(NPROC_ENV):
        cmd = ["memrl", *args, "--nproc-per-node", env[NPROC_ENV], "--resume"]
    elif world > 1:
        per_node = env.get("LOCAL_WORLD_SIZE") or str(world // nodes)
        launcher = ["--standalone"] if nodes == 1 else [f"--nnodes={nodes}"]
        cmd = ["torchrun", *launcher, f"--nproc-per-node={per_node}", "-m", "memrl", *args,
               "--resume"]
    else:
        cmd = ["memrl", *args, "--resume"]
    text = " ".join(shlex.quote(a) for a in cmd)
    if world > 1 and nodes > 1 and not env.get(NPROC_ENV):
        text += " (on every node, with this run's rendezvous options)"
    return text


def rank_on_signal(signum: int) -> int | None:
    """SIGINT / SIGTERM on one rank of several: a lost peer is reported instead (torchrun
    sends SIGTERM to the survivors once a rank died: no interruption), and otherwise only
    the main rank says `interrupted` (the exit code of the others is the same)."""
    from memrl.distributed import heartbeat
    from memrl.interrupt import exit_code_for

    beat = heartbeat.current()
    if beat is not None:
        verdict = beat.verdict()
        if verdict is not None:
            beat.report(verdict)
            return heartbeat.EXIT_PEER_LOST
        beat.set_state("interrupted")
    if os.environ.get("RANK", "0") != "0":
        return exit_code_for(signum)
    return None


def end_if_a_rank_is_lost(exc: BaseException, dist_timeout_s: float) -> None:
    """A rank of several raised `exc`: if a peer is lost (a collective failed for it; waiting
    up to the heartbeat's bound for a peer on another machine to go stale) or every rank is
    alive but a collective failed (one is stuck), one line and exit 1 (SystemExit); else mark
    this rank failed, for its peers to report, and return (the caller re-raises)."""
    from memrl.distributed import collective_failed, heartbeat

    beat = heartbeat.current()
    if beat is None:
        return
    collective = collective_failed(exc)
    verdict = beat.verdict(wait_s=beat.bound_s if collective else 0.0)
    if verdict is None and collective:
        verdict = beat.stuck(exc, dist_timeout_s)
    if verdict is not None:
        beat.report(verdict)
        raise SystemExit(heartbeat.EXIT_PEER_LOST) from None
    lines = str(exc).strip().splitlines()
    beat.set_state(f"failed: {type(exc).__name__}" + (f": {lines[0]}" if lines else ""))


class TrainProgress:
    """How far a run got, said when it is interrupted (see `memrl.interrupt`)."""

    def __init__(self, out_dir: Path, *, on_ray: bool = False) -> None:
        self.out_dir = out_dir
        self.on_ray = on_ray
        self.run: Any = None

    def started(self, run: Any) -> None:
        self.run = run

    def saved(self) -> str:
        """`last complete checkpoint: DIR`, or that there is none yet."""
        from memrl.run.checkpoint import latest_checkpoint

        latest = latest_checkpoint(self.out_dir / "checkpoints")
        return f"last complete checkpoint: {latest}" if latest else "no checkpoint saved yet"

    def describe(self) -> str:
        from memrl.recipes.grpo import total_steps

        saved = self.saved()
        if self.on_ray:  # the run lives in the Ray workers: say what is on disk
            return f"during the training run on Ray in {self.out_dir}; {saved}"
        if self.run is None:
            return f"while setting up the training run in {self.out_dir} (no step was run)"
        done = self.run.state.step
        total = total_steps(self.run.config, len(self.run.stream.records))
        where = (f"after the last step ({total} of {total})" if done >= total
                 else f"in step {done + 1} of {total}")
        return f"{where} of the training run in {self.out_dir}; {saved}"

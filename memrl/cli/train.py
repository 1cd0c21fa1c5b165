"""`memrl train CONFIG.yaml [key.path=value ...] [--resume]`."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.cli.app import app

ResumeOption = Annotated[bool, typer.Option(
    "--resume", help="Continue from the latest checkpoint (trainer.resume=auto).")]


@app.command("train")
def train(
    config: Path = typer.Argument(..., help="Training config (YAML)."),
    overrides: list[str] = typer.Argument(
        None, help="Dotted overrides, e.g. rollout.n=8 memagent.chunk_size=512"
    ),
    resume: ResumeOption = False,
    nproc_per_node: int = typer.Option(
        1,
        "--nproc-per-node",
        min=1,
        help="Train on N processes of this machine (data parallel; one GPU each on CUDA): "
        "memrl starts `torchrun --standalone --nproc-per-node N` on itself.",
    ),
) -> None:
    """Train a memory agent with GRPO-family RL.

    Ctrl-C or SIGTERM stops the run with one line saying at which step it stopped, its last
    complete checkpoint and the command that continues from it; exit code 130 / 143. A failure
    of the machinery (every rollout server lost, a rollout engine off the policy) is one line
    with the same, exit code 1.
    """
    from rich.console import Console

    from memrl.config import load_config
    from memrl.distributed import destroy_process_group, heartbeat, launched, relaunch
    from memrl.errors import InfrastructureError
    from memrl.fileio import check_output_dir
    from memrl.interrupt import exit_on_signals
    from memrl.recipes import grpo
    from memrl.recipes.config import TrainConfig

    extra = list(overrides or [])
    if resume:
        extra.append("trainer.resume=auto")
    cfg = load_config(TrainConfig, config, extra)
    on_ray = cfg.trainer.launcher == "ray"
    check_launcher(on_ray, nproc_per_node)
    if nproc_per_node > 1 and not launched():
        raise typer.Exit(
            relaunch(nproc_per_node, ["train", str(config), *(overrides or []),
                                      *(["--resume"] if resume else [])])
        )
    out_dir = Path(cfg.trainer.out_dir)
    check_output_dir(out_dir, location=f"trainer.out_dir {out_dir}")
    console = Console()
    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        ranks = f" on {cfg.trainer.ray.num_workers} Ray workers" if on_ray else ""
        console.print(f"training → {out_dir}{ranks}")
    progress = TrainProgress(out_dir, on_ray=on_ray)
    how = "continue with: " + resume_command(config, list(overrides or []))
    heartbeat.set_epilogue(lambda: f"{progress.saved()}; {how}")
    try:
        with record_training("train", cfg, cfg.rollout.engine), \
                exit_on_signals(progress.describe, how, on_signal=rank_on_signal):
            if on_ray:
                from memrl.distributed import train_on_ray

                state = train_on_ray(cfg, train_rank)
            else:
                try:
                    state = grpo.train(cfg, console=console, on_start=progress.started)
                except InfrastructureError as exc:
                    raise InfrastructureError(f"{exc}; stopped {progress.describe()}; {how}") \
                        from exc
                except Exception as exc:
                    end_if_a_rank_is_lost(exc, cfg.trainer.dist_timeout_s)
                    raise
    finally:
        destroy_process_group()
        heartbeat.set_epilogue(None)
    if not main_rank:
        return
    console.print(
        f"done: {state.step} steps; metrics {out_dir / 'metrics.jsonl'}, "
        f"plot {out_dir / 'training.png'}"
    )


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
    alive but a collective failed (one is stuck), one line and exit 1 (typer.Exit); else mark
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
        raise typer.Exit(heartbeat.EXIT_PEER_LOST) from None
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

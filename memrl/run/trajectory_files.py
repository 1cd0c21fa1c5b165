"""Where a run's per-trajectory step files live, and reading and pruning them.

`train_trajectories/step_{k:06d}.jsonl` in the run directory (`memrl.run.trajectory_log`
writes them during training; its docstring describes a row). Kept apart from the writer,
which needs torch, so that reading a run (`memrl view`) does not import it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["TRAJECTORY_DIR", "read_step_files", "remove_steps_after", "step_file", "step_files"]

TRAJECTORY_DIR = "train_trajectories"
"""The folder of a run directory that holds the step files."""

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


def step_file(out_dir: str | Path, step: int) -> Path:
    """Where step `step`'s rows go."""
    return Path(out_dir) / TRAJECTORY_DIR / f"step_{step:06d}.jsonl"


def step_files(run_dir: str | Path) -> dict[int, Path]:
    """{step: path} of the step files under `run_dir/train_trajectories` (step order)."""
    folder = Path(run_dir) / TRAJECTORY_DIR
    if not folder.is_dir():
        return {}
    found = ((_STEP_FILE.match(p.name), p) for p in folder.iterdir())
    return dict(sorted((int(m.group(1)), p) for m, p in found if m and p.is_file()))


def remove_steps_after(out_dir: str | Path, step: int) -> None:
    """Delete the step files of steps after `step` (a resumed run redoes them; -1: all)."""
    for k, path in step_files(out_dir).items():
        if k > step:
            path.unlink(missing_ok=True)


def read_step_files(run_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """{step: rows} of every step file under `run_dir/train_trajectories` (step order)."""
    from memrl.data.io import expect_object, iter_jsonl

    return {k: [dict(expect_object(v, f"{path}:{n}", "trajectory row"))
                for n, v in iter_jsonl(path)]
            for k, path in step_files(run_dir).items()}

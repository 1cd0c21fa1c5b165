"""The layout of a training checkpoint, and finding the newest complete one.

Layout of one checkpoint, `ROOT/step_00000012/`:
    model/              save_pretrained of the policy (full weights, or only the LoRA adapter)
    model/memrl_model.json   which of the two it is, and the base model of an adapter
    tokenizer/          save_pretrained of the tokenizer
    optimizer.pt  scheduler.pt  rng.pt  trainer_state.json  config.yaml
    critic/             PPO's value model, its optimizer and schedule (rl.adv_estimator=gae;
                        `memrl.run.checkpoint.critic`)
and `ROOT/latest` names the newest complete one.

A policy sharded with FSDP (`model.strategy: fsdp`) is saved sharded instead, by every rank
at once with torch.distributed.checkpoint (DCP), and can be loaded on any number of ranks
(DCP reshards), into a sharded or a replicated policy:
    model/              memrl_model.json (format "sharded") and the model's config.json
    sharded/            DCP: {"model": weights, "optim": AdamW state}, by parameter name
    rng/rank_00000.pt   the RNG state of every rank (a rank with no file takes rank 0's)
    critic/sharded/     PPO: the critic, sharded the same way (DCP), and critic/scheduler.pt
    tokenizer/  scheduler.pt  trainer_state.json  config.yaml   (main rank)

A checkpoint is written into `ROOT/.tmp-step_.../` and renamed into place, so a `step_*`
directory is always complete: a run killed mid-save leaves only a `.tmp-*` leftover, which
readers ignore and the next save deletes. Sharded: the main rank renames it once every rank
has written its part (a barrier).
"""
from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from memrl.errors import MemrlInputError

LATEST_FILE = "latest"
MODEL_DIR = "model"
TOKENIZER_DIR = "tokenizer"
MODEL_MARKER = "memrl_model.json"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng.pt"
CONFIG_FILE = "config.yaml"
SHARDED_DIR = "sharded"
CRITIC_DIR = "critic"
RANK_RNG_DIR = "rng"
TMP_PREFIX = ".tmp-"
STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def is_complete_checkpoint(path: Path) -> bool:
    return (path / TRAINER_STATE).is_file() and (path / MODEL_DIR).is_dir()


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete `step_*` directories of `root`, oldest step first."""
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = STEP_DIR.match(d.name)
        if m and d.is_dir() and is_complete_checkpoint(d):
            found.append((int(m.group(1)), d))
    return sorted(found)


def latest_checkpoint(
    root: str | Path, *, warn: Callable[[str], None] | None = None
) -> Path | None:
    """The checkpoint named by `root/latest`, else the highest complete step; None if none.

    A `latest` that is corrupt (not a step name, unreadable) or dangling (its checkpoint is
    gone or incomplete) is passed over for the newest complete checkpoint; `warn` is then
    called with one line saying so.
    """
    root = Path(root)
    latest = root / LATEST_FILE
    problem = None
    if latest.is_file() or latest.is_symlink():
        try:
            name = latest.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            name = None
        if name is None or not STEP_DIR.match(name):
            problem = "is corrupt (not the name of a step_* directory)"
        elif not is_complete_checkpoint(root / name):
            problem = f"names {name}, which is missing or incomplete"
        else:
            return root / name
    found = complete_checkpoints(root)
    newest = found[-1][1] if found else None
    if problem is not None and warn is not None:
        instead = f"using the newest complete checkpoint, {newest.name}" if newest else (
            "no complete checkpoint found")
        warn(f"{latest} {problem}; {instead}")
    return newest


def resolve_checkpoint(path: str | Path, *, warn: Callable[[str], None] | None = None) -> Path:
    """A checkpoint directory from a checkpoint, a checkpoints root, or a training run dir
    (`warn`: see `latest_checkpoint`)."""
    p = Path(path)
    if not p.exists():
        raise MemrlInputError("no such checkpoint or run directory", location=str(p))
    if not p.is_dir():
        raise MemrlInputError("a checkpoint must be a directory", location=str(p))
    if is_complete_checkpoint(p):
        return p
    for root in (p, p / "checkpoints"):
        found = latest_checkpoint(root, warn=warn)
        if found is not None:
            return found
    raise MemrlInputError(
        f"not a checkpoint (no {TRAINER_STATE} and {MODEL_DIR}/), and no complete "
        "checkpoint below it or below its checkpoints/",
        location=str(p),
    )


def checkpoint_config(model_dir: str | Path) -> Path | None:
    """The training config (`config.yaml`) of the checkpoint whose `model/` directory
    `model_dir` is; None when `model_dir` is not inside a checkpoint."""
    parent = Path(model_dir).resolve().parent
    if (parent / TRAINER_STATE).is_file() and (parent / CONFIG_FILE).is_file():
        return parent / CONFIG_FILE
    return None


def read_checkpoint_marker(path: str | Path) -> dict[str, Any]:
    """`model/memrl_model.json` of a checkpoint: {"format": "full"|"lora"|"sharded",
    "base_model": ...}."""
    marker = Path(path) / MODEL_DIR / MODEL_MARKER
    data = read_json(marker)
    if data.get("format") not in ("full", "lora", "sharded"):
        raise MemrlInputError(
            f"unknown model format {data.get('format')!r}", location=f"{marker}: key format"
        )
    return data


def read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise MemrlInputError(f"checkpoint is missing {file.name}", location=str(file))
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MemrlInputError(f"corrupt checkpoint file: {exc}", location=str(file)) from None
    if not isinstance(data, dict):
        raise MemrlInputError("corrupt checkpoint file: not a JSON object", location=str(file))
    return data


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DistributedDataParallel wrapper (its `state_dict` adds `module.`)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


def is_peft(model: torch.nn.Module) -> bool:
    # Checked by module name so that full-model training never imports peft.
    return type(model).__module__.startswith("peft.")


def remove_leftovers(root: Path) -> None:
    """Delete `.tmp-*` files and directories left by a save that was killed."""
    for p in root.glob(f"{TMP_PREFIX}*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)

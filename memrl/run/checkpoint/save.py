"""Saving a checkpoint atomically (whole, or sharded by every rank with DCP), pointing
`latest` at it and keeping the last K (the layout: `memrl.run.checkpoint.layout`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.fileio import MIN_FREE_BYTES, fsync_dir, write_atomic
from memrl.rl.trainer.sharding import is_sharded
from memrl.run.checkpoint.critic import save_critic, save_critic_shards
from memrl.run.checkpoint.layout import (
    CONFIG_FILE,
    CRITIC_DIR,
    LATEST_FILE,
    MODEL_DIR,
    MODEL_MARKER,
    OPTIMIZER_FILE,
    RANK_RNG_DIR,
    RNG_FILE,
    SCHEDULER_FILE,
    SHARDED_DIR,
    TMP_PREFIX,
    TOKENIZER_DIR,
    TRAINER_STATE,
    complete_checkpoints,
    is_peft,
    remove_leftovers,
    step_dir_name,
    unwrap,
)
from memrl.run.checkpoint.rng import get_rng_state, set_rng_state
from memrl.run.checkpoint.shards import write_shards


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    tokenizer: Any | None,
    trainer_state: dict[str, Any],
    config_yaml: str,
    keep_last: int,
    dist: Dist = Dist(),
    critic: Any | None = None,
) -> Path | None:
    """Write `root/step_{step:08d}/` atomically, point `root/latest` at it, prune old ones.

    Called by every rank: the main rank writes the checkpoint (with a sharded model every
    rank writes its shards into it first) and returns its path; the others return None once
    it is complete. `critic` (model, optimizer, scheduler; PPO) is saved beside the policy
    in `critic/` by the main rank (a sharded one's shards by every rank first). The RNG
    states are captured on entry and restored on exit, so saving draws nothing from any
    generator: a run with checkpoints continues exactly like one without.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if not (dist.is_main or is_sharded(model) or _sharded_critic(critic)):
        dist.barrier()  # the main rank saves alone; the next step starts once it is done
        return None
    rng = get_rng_state()
    root = Path(root)
    final = root / step_dir_name(step)
    try:
        _save_atomically(
            root, final, model=model, optimizer=optimizer, scheduler=scheduler,
            tokenizer=tokenizer, rng=rng, state={**trainer_state, "step": step},
            config_yaml=config_yaml, dist=dist, critic=critic,
        )
        if dist.is_main:
            write_atomic(
                root / LATEST_FILE,
                final.name + "\n",
                durable=True,
                tmp_prefix=f"{TMP_PREFIX}{LATEST_FILE}-",
            )
            _prune(root, keep_last=keep_last, newest=final)
            remove_leftovers(root)
    except Exception as exc:
        problem = _storage_problem(exc, root)
        if problem is None:
            raise
        raise MemrlInputError(
            f"cannot save the checkpoint: {problem}; the previous checkpoints are intact",
            location=str(final),
        ) from None
    set_rng_state(rng)
    dist.barrier()
    return final if dist.is_main else None


def _save_atomically(
    root: Path, final: Path, *, model: torch.nn.Module, optimizer: Any, scheduler: Any,
    tokenizer: Any, rng: dict[str, Any], state: dict[str, Any], config_yaml: str, dist: Dist,
    critic: Any = None,
) -> None:
    """Write the checkpoint into `root/.tmp-*` and rename it to `final`: complete or absent.
    Sharded: every rank writes its shards and RNG state there, then the main rank the rest."""
    from memrl.run.metrics import scrub_env_secrets

    sharded = is_sharded(model)
    every_rank = sharded or _sharded_critic(critic)
    tmp: Path | None = None
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        remove_leftovers(root)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}-", dir=root))
    if every_rank:
        tmp = Path(dist.all_gather(str(tmp))[0])  # the main rank's directory, on every rank
    assert tmp is not None
    aside: Path | None = None
    try:
        if sharded:
            write_shards(tmp / SHARDED_DIR, model, optimizer)
            (tmp / RANK_RNG_DIR).mkdir(exist_ok=True)
            torch.save(rng, tmp / RANK_RNG_DIR / f"rank_{dist.rank:05d}.pt")
        if _sharded_critic(critic):
            save_critic_shards(tmp / CRITIC_DIR, critic)
        if every_rank:
            dist.barrier()
            if not dist.is_main:
                return
        if sharded:
            _write_sharded_marker(tmp / MODEL_DIR, model)
        else:
            _write_model(tmp / MODEL_DIR, model)
            if optimizer is not None:
                torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            torch.save(rng, tmp / RNG_FILE)
        if critic is not None:
            save_critic(tmp / CRITIC_DIR, critic)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / TOKENIZER_DIR)
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / SCHEDULER_FILE)
        (tmp / CONFIG_FILE).write_text(scrub_env_secrets(config_yaml), encoding="utf-8")
        (tmp / TRAINER_STATE).write_text(
            json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        _apply_umask(tmp)
        _fsync_tree(tmp)
        if final.exists():
            # Saving the same step again (e.g. the end-of-training save after a periodic one):
            # move the old copy aside first; rename cannot replace a non-empty directory.
            aside = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-{final.name}-", dir=root))
            os.rename(final, aside / final.name)
        os.rename(tmp, final)
    except BaseException as exc:
        if not dist.is_main:
            raise  # the main rank owns (and removes) the directory
        # Whether the disk was full is seen now, not once the half-written checkpoint is gone
        # (torch.save reports a short write as `RuntimeError ... unexpected pos`).
        full = _storage_problem(exc, root) if isinstance(exc, Exception) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None and not final.exists() and (aside / final.name).is_dir():
            os.rename(aside / final.name, final)  # put the old copy back
        if full is not None and not isinstance(exc, OSError):
            raise OSError(errno.ENOSPC, full) from exc
        raise
    fsync_dir(root)


_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _storage_problem(exc: BaseException, root: Path) -> str | None:
    """What the user can fix about a failed save (disk full, read-only, no permission), or
    None for anything else (a bug, kept as a traceback). torch.save reports a full disk as a
    RuntimeError (and safetensors as its own error naming os error 28), so the message and
    the free space are looked at too."""
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        return exc.strerror or os.strerror(exc.errno)
    text = str(exc)
    for code in (errno.ENOSPC, errno.EDQUOT):
        if os.strerror(code) in text or f"os error {code})" in text:
            return os.strerror(code)
    try:
        free = shutil.disk_usage(root if root.exists() else root.parent).free
    except OSError:
        return None
    if free < MIN_FREE_BYTES:
        return f"no space left on the device of {root} ({free} bytes free)"
    return None


def _apply_umask(tmp: Path) -> None:
    """The user's usual permissions on the whole checkpoint: mkdtemp makes its directory 0700
    and safetensors its files 0600, which would hide a checkpoint from the user's group."""
    mask = os.umask(0)
    os.umask(mask)
    for dirpath, _dirnames, filenames in os.walk(tmp):
        os.chmod(dirpath, 0o777 & ~mask)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o666 & ~mask)


def _write_model(out: Path, model: torch.nn.Module) -> None:
    model = unwrap(model)
    if is_peft(model):
        model.save_pretrained(out)
        base = _peft_base_path(model)
        marker = {"format": "lora", "base_model": base}
    else:
        model.save_pretrained(out)
        marker = {"format": "full", "base_model": None}
    (out / MODEL_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _sharded_critic(critic: Any) -> bool:
    """Whether `critic` (or None) is sharded with FSDP: every rank writes its shards."""
    return critic is not None and is_sharded(critic.model)


def _write_sharded_marker(out: Path, model: torch.nn.Module) -> None:
    """The model's config (to rebuild it for export) and the sharded format's marker."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    marker = {"format": "sharded", "base_model": None, "dtype": dtype}
    (out / MODEL_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _peft_base_path(model: Any) -> str | None:
    cfg = model.peft_config.get(model.active_adapter)
    return getattr(cfg, "base_model_name_or_path", None) or None


def _fsync_tree(path: Path) -> None:
    """Flush every file and directory under `path` to disk before it is renamed into place."""
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def _prune(root: Path, *, keep_last: int, newest: Path) -> None:
    """Delete the oldest complete checkpoints so that `keep_last` remain, never `newest`."""
    others = [d for _, d in complete_checkpoints(root) if d.name != newest.name]
    doomed = others[: max(0, len(others) - (keep_last - 1))]
    for d in doomed:
        # Rename first: a kill during rmtree must not leave a half-deleted `step_*` directory.
        trash = root / f"{TMP_PREFIX}del-{d.name}"
        os.rename(d, trash)
        shutil.rmtree(trash, ignore_errors=True)

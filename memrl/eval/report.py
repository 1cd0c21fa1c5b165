"""Writers every evaluation shares: results JSON, trajectories JSONL, tables, score plots.

They know nothing about a benchmark: callers pass rows and columns. Files are written to a
temporary name and renamed, so an interrupted run never leaves a half-written results file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from memrl.eval.resume import encode_text
from memrl.fileio import write_atomic


def _json_default(obj: Any) -> Any:
    """Serialise the few non-JSON types results carry (pydantic models, paths, sets)."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def write_json(path: str | Path, data: Any) -> Path:
    """Pretty JSON (UTF-8, non-ASCII kept; a lone surrogate is written as its escape)."""
    path = Path(path)
    text = json.dumps(data, indent=2, ensure_ascii=False, default=_json_default)
    write_atomic(path, encode_text(text + "\n"))
    return path


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """One JSON object per line (encoded as `write_json` does)."""
    path = Path(path)
    lines = [json.dumps(row, ensure_ascii=False, default=_json_default) for row in rows]
    write_atomic(path, encode_text("".join(line + "\n" for line in lines)))
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read back what write_jsonl wrote (blank lines ignored)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def format_cell(value: Any, digits: int = 1) -> str:
    """Floats rounded to `digits`, None as '-', everything else str()."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 1) -> str:
    """A GitHub-flavoured Markdown table, for results files people read."""
    cells = [[format_cell(v, digits) for v in row] for row in rows]
    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
        *("| " + " | ".join(row) + " |" for row in cells),
    ]
    return "\n".join(lines) + "\n"


def rich_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 1
):
    """A rich Table with right-aligned columns, for the terminal."""
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(format_cell(v, digits) for v in row))
    return table


def plot_scores(
    path: str | Path,
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    labels: Sequence[str] | None = None,
    logx: bool = True,
    ylim: tuple[float, float] | None = (0.0, 100.0),
) -> Path:
    """Line plot of several score series against one x axis (PNG, headless Agg backend).

    `labels` annotate each x point (e.g. "N=50").
    """
    with saved_figure(path, figsize=(6.4, 4.2), dpi=120) as (_, axes):
        ax = axes[0][0]
        for name, ys in series.items():
            ax.plot(list(x), list(ys), marker="o", label=name)
        if logx and all(v > 0 for v in x):
            ax.set_xscale("log")
        if labels is not None:
            for xi, label in zip(x, labels, strict=True):
                ax.annotate(
                    label, (xi, ylim[0] if ylim else 0), textcoords="offset points",
                    xytext=(0, 4), ha="center", fontsize=7, color="gray",
                )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ylim is not None:
            ax.set_ylim(*ylim)
        if title:
            ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return Path(path)


@contextmanager
def saved_figure(path: str | Path, *, figsize: tuple[float, float], dpi: int,
                 columns: int = 1) -> Iterator[tuple[Any, Any]]:
    """A matplotlib figure of `columns` side-by-side axes (headless Agg backend), yielded as
    (figure, axes[0][i]); laid out and saved as the PNG `path` (its folder made) when the
    block ends, and closed however it ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, columns, figsize=figsize, squeeze=False)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)


def plot_panels(
    path: str | Path,
    panels: Sequence[Mapping[str, Any]],
    *,
    title: str = "",
) -> Path:
    """Side-by-side line plots (PNG, headless Agg backend). Each panel is a mapping with
    `series` ({name: (xs, ys)}; a None y is a gap), `xlabel`, `ylabel` and optionally
    `title` and `ylim`."""
    with saved_figure(path, figsize=(4.6 * len(panels), 4.0), dpi=110,
                      columns=len(panels)) as (fig, axes):
        for ax, panel in zip(axes[0], panels, strict=True):
            for name, (xs, ys) in panel["series"].items():
                y = [math.nan if v is None else v for v in ys]
                ax.plot(list(xs), y, marker="o" if len(y) <= 40 else None, markersize=3,
                        label=name)
            ax.set_xlabel(panel["xlabel"])
            ax.set_ylabel(panel["ylabel"])
            if panel.get("ylim") is not None:
                ax.set_ylim(*panel["ylim"])
            if panel.get("title"):
                ax.set_title(panel["title"], fontsize=10)
            ax.grid(True, alpha=0.3)
            if panel["series"]:
                ax.legend(fontsize=8)
        if title:
            fig.suptitle(title, fontsize=11)
    return Path(path)


def run_header(
    benchmark: str, generator: Any, model_name: str | None, config: Any, **fields: Any
) -> dict[str, Any]:
    """The first keys of every results.json: what ran, on which model, with which config."""
    from datetime import datetime, timezone

    model = model_name or getattr(generator, "name_or_path", None) or type(generator).__name__
    return {
        "benchmark": benchmark,
        "model": model,
        **fields,
        "config": config.model_dump(mode="json"),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def finish_header(results: dict[str, Any]) -> None:
    from datetime import datetime, timezone

    results["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")


def progress_bars(console: Any, show: bool) -> Any:
    """The rich Progress every evaluation shows (description, bar, done/total, elapsed)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=not show,
    )


def write_report(
    out: Path, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], console: Any,
    note: str = "",
) -> None:
    """results.md (the table as Markdown, plus a note) and the same table on the console.
    When `out` holds a run record (`memrl.run.record`), or its parent does (a benchmark's
    directory of a `memrl eval` run), its key facts head the table."""
    from memrl.run.record import read_record, summary_line

    record = read_record(out) or read_record(Path(out).parent)
    run = f"Run: {summary_line(record, with_status=False)}\n\n" if record else ""
    text = f"# {title}\n\n" + run + markdown_table(columns, rows) + note
    write_atomic(out / "results.md", encode_text(text))
    console.print(rich_table(title, columns, rows))

"""LoCoMo evaluation of the MemoryUpdate agent: how answerable its final memory makes each
question, per LoCoMo category, and what it did to the memory.

For every episode (one QA pair) the agent edits a trial copy of the episode's initial memory
without seeing the question (exactly as in training, through `MemoryUpdateTask.rollout`);
the question is then answered over the initial and over the final memory. Per category:

- `f1_initial`, `f1_final`, `delta`: the answerer's score (`retrieval`: best token F1 /
  containment of the gold answer among the top-k memories; `llm`: token F1 of the model's
  answer from them), over the initial and the final memory, and their difference.
  Category 5 (adversarial: the gold is a bait answer, the right reply "not mentioned") is
  not scored (None); its recall and memory statistics are still reported.
- `recall_initial`, `recall_final`: share of episodes where one of the top-k memories
  retrieved for the question covers an evidence turn (token F1 >= `recall_threshold`,
  default 0.5, with the turn's text; `memrl.rewards.memory_delta.evidence_recall`).
- `reward`: the training reward (memory delta x efficiency - format penalty).
- memory statistics per episode: inserts / updates / deletes / searches, growth in words
  and in entries, replies and the share of replies with a format error.

The `all` row pools categories 1-4 (every trajectory counts once). Files in `out_dir`:
`results.json`, `results.md`, `trajectories.jsonl` (one log row per trajectory).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memrl.agents.memupdate import MemUpdateConfig
from memrl.agents.trajectory import Trajectory
from memrl.data.locomo import ADVERSARIAL_CATEGORY, CATEGORY_NAMES, MemoryEpisode
from memrl.errors import MemrlInputError
from memrl.eval.report import (
    finish_header,
    progress_bars,
    run_header,
    write_json,
    write_jsonl,
    write_report,
)
from memrl.inference.base import Generator, derive_seed
from memrl.memory.embedder import Embedder
from memrl.tasks.memupdate_locomo import MemoryUpdateTask

ALL_CATEGORIES = (1, 2, 3, 4, 5)
DEFAULT_CATEGORIES = (1, 2, 3, 4)
TABLE_COLUMNS = (
    "category", "episodes", "F1 init", "F1 final", "ΔF1", "recall init", "recall final",
    "ins/ep", "upd/ep", "del/ep", "growth (words)", "format err %",
)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def aggregate(trajectories: Sequence[Trajectory], scored: bool = True) -> dict[str, Any]:
    """Means over trajectories (every sample counts once); scores None when not `scored`."""
    m = lambda key: _mean([t.metrics[key] for t in trajectories])  # noqa: E731
    info = lambda f: _mean([f(t.info) for t in trajectories])  # noqa: E731
    return {
        "n": len(trajectories),
        "episodes": len({t.record_id for t in trajectories}),
        "f1_initial": m("score_initial") if scored else None,
        "f1_final": m("score_final") if scored else None,
        "delta": m("delta") if scored else None,
        "reward": _mean([float(t.reward) for t in trajectories]),
        "recall_initial": m("recall_initial"),
        "recall_final": m("recall_final"),
        "inserts": m("inserts"),
        "updates": m("updates"),
        "deletes": m("deletes"),
        "searches": m("searches"),
        "memory_growth_tokens": m("memory_growth_tokens"),
        "memory_growth_entries": info(
            lambda i: i["memory_after"]["count"] - i["memory_before"]["count"]
        ),
        "memory_size_initial": info(lambda i: i["memory_before"]["count"]),
        "memory_size_final": info(lambda i: i["memory_after"]["count"]),
        "turns": m("turns"),
        "format_error_rate": m("format_error_rate"),
        "efficiency": m("efficiency"),
    }


def table_rows(per_category: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Rows of the results table (scores and recall in %)."""
    pct = lambda v: None if v is None else 100.0 * v  # noqa: E731
    rows = []
    for key, r in per_category.items():
        name = f"{key} {CATEGORY_NAMES[int(key)]}" if key.isdigit() else key
        rows.append([
            name, r["episodes"], pct(r["f1_initial"]), pct(r["f1_final"]), pct(r["delta"]),
            pct(r["recall_initial"]), pct(r["recall_final"]), r["inserts"], r["updates"],
            r["deletes"], r["memory_growth_tokens"], pct(r["format_error_rate"]),
        ])
    return rows


def check_categories(categories: Sequence[int]) -> list[int]:
    """Sorted unique categories, each 1..5; anything else is a user error."""
    if not categories:
        raise MemrlInputError("give at least one category (1-5)", location="--categories")
    bad = [c for c in categories if c not in ALL_CATEGORIES]
    if bad:
        raise MemrlInputError(
            f"unknown category {bad[0]}; LoCoMo has "
            + ", ".join(f"{k} ({v})" for k, v in CATEGORY_NAMES.items()),
            location="--categories",
        )
    return sorted(set(categories))


def evaluate_locomo(
    generator: Generator,
    data: str | Path,
    *,
    config: MemUpdateConfig,
    out_dir: str | Path,
    categories: Sequence[int] = DEFAULT_CATEGORIES,
    limit: int | None = None,
    num_samples: int = 1,
    episodes_per_run: int = 32,
    embedder: Embedder | None = None,
    model_name: str | None = None,
    console: Any = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run the MemoryUpdate agent on prepared LoCoMo episodes; write and return results.

    `data` is a `memrl prepare locomo` directory (precomputed embeddings are used when they
    match the embedder). `limit` keeps the first K episodes of the chosen categories;
    `episodes_per_run` episodes run together in lockstep.
    """
    from rich.console import Console

    categories = check_categories([int(c) for c in categories])
    for option, value in (("--limit", limit), ("--samples", num_samples),
                          ("episodes_per_run", episodes_per_run)):
        if value is not None and value < 1:
            raise MemrlInputError(f"must be >= 1, got {value}", location=option)
    data = Path(data)
    if not data.exists():
        raise MemrlInputError("LoCoMo data not found (build it with `memrl prepare locomo`)",
                              location=str(data))
    config = config.model_copy(
        update={"include_adversarial": ADVERSARIAL_CATEGORY in categories}
    )
    task = MemoryUpdateTask(config, embedder=embedder)
    episodes: list[MemoryEpisode] = [
        e for e in task.load(str(data), "locomo", what="evaluation") if e.category in categories
    ][:limit]
    if not episodes:
        raise MemrlInputError(
            f"no episodes of categories {', '.join(map(str, categories))}", location=str(data)
        )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    started = time.perf_counter()
    results = run_header(
        "locomo", generator, model_name, config,
        data=str(data), categories=categories, limit=limit, num_samples=num_samples,
        num_episodes=len(episodes), embedder=task.embedder.name, metric="f1_final",
    )
    trajectories: list[Trajectory] = []
    with progress_bars(console, show_progress) as progress:
        bar = progress.add_task("LoCoMo episodes", total=len(episodes))
        for i in range(0, len(episodes), episodes_per_run):
            trajectories += task.rollout(
                generator, episodes[i : i + episodes_per_run], num_samples=num_samples,
                seed=derive_seed(config.seed or 0, "locomo", i), keep_token_ids=False,
                progress=lambda done: progress.advance(bar, done),
            )
    elapsed = time.perf_counter() - started

    by_id = {e.id: e for e in episodes}
    write_jsonl(out / "trajectories.jsonl",
                (task.log_row(t, by_id[t.record_id]) for t in trajectories))
    per_category: dict[str, dict[str, Any]] = {}
    for c in categories:
        group = [t for t in trajectories if by_id[t.record_id].category == c]
        if group:
            per_category[str(c)] = aggregate(group, scored=c != ADVERSARIAL_CATEGORY)
    answerable = [t for t in trajectories if by_id[t.record_id].category != ADVERSARIAL_CATEGORY]
    if answerable:
        per_category["all"] = aggregate(answerable)
    results["results"] = per_category
    finish_header(results)
    results["timings"] = {"total_s": elapsed,
                          "per_episode_s": elapsed / len(episodes)}
    write_json(out / "results.json", results)

    note = (
        f"\nAnswerer `{config.answerer}` over the top {config.top_k} memories "
        f"({task.embedder.name}); scores and recall in %, edits and growth per episode.\n"
    )
    title = f"LoCoMo · MemoryUpdate · {results['model']}"
    write_report(out, title, TABLE_COLUMNS, table_rows(per_category), console, note)
    return results

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
- `recall_at_k_initial`, `recall_at_k_final`: evidence recall@k (k = `top_k`), a memory
  quality that does not depend on any QA model: per question, the share of its evidence
  turns held by the top-k memories retrieved for it, a turn being held by a memory within
  token F1 `recall_threshold` of the turn's text or of a LoCoMo observation fact written
  from it (`memrl.rewards.memory_delta.evidence_recall_at_k`); mean over questions.
- `valid_call_rate`: of the tool calls the replies attempted, the share that parsed and
  passed the schema (None when no call was attempted).
- `reward`: the training reward (memory delta x efficiency - format penalty).
- memory statistics per episode: inserts / updates / deletes / searches, growth in words
  and in entries, replies and the share of replies with a format error;
- `memory`: the dialogue sessions read per episode, the memory size (entries, characters)
  before and after, and the operations and growth per session read
  (`memrl.eval.memory_trace.memory_per_session`), also a table in results.md.

The `all` row pools categories 1-4 (every trajectory counts once).

Scored as the memory literature does (mem0, Memory-R1; docs/protocols.md), per category and
overall, for the answer the final memory yields (the `llm` answerer's prediction; with the
`retrieval` answerer the top retrieved memory, a proxy that is not comparable with papers):
`set_f1` (mem0's token-set F1 against the gold), `bleu1` (BLEU-1) and, with a `judge`
generator, `judge` (share of CORRECT verdicts for mem0's judge prompt, greedy) and
`judge_unreadable` (verdicts that could not be read; they count as WRONG).

`split` keeps the conversations of one side of the training / held-out split
(`memrl.data.locomo.split_conversations`: conv-48, conv-49 and conv-50 held out). Files in
`out_dir`: `results.json`, `results.md`,
`trajectories.jsonl` (one log row per trajectory, appended after every run of
`episodes_per_run` episodes). Running again into the same `out_dir` (same model, config and
judge, else a one-line error) skips the episodes already there and finishes the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memrl.agents.memupdate import MemUpdateConfig
from memrl.data.locomo import (
    ADVERSARIAL_CATEGORY,
    CATEGORY_NAMES,
    MemoryEpisode,
    check_split,
    load_episodes,
    split_by_conversation,
)
from memrl.distributed import Dist
from memrl.errors import MemrlInputError
from memrl.eval.memory_trace import (
    SESSION_COLUMNS,
    memory_per_session,
    session_line,
    session_rows,
)
from memrl.eval.report import markdown_table, progress_bars, rich_table, run_header, write_report
from memrl.eval.runner import EvalRun, check_counts, open_run, run_episodes
from memrl.inference.base import Generator, derive_seed
from memrl.memory.embedder import Embedder
from memrl.rewards.locomo_metrics import bleu1, judge_prompt, parse_judge_label, token_set_f1
from memrl.tasks.memupdate_locomo import MemoryUpdateTask, valid_call_rate

ALL_CATEGORIES = (1, 2, 3, 4, 5)
DEFAULT_CATEGORIES = (1, 2, 3, 4)
TABLE_COLUMNS = (
    "category", "episodes", "F1 init", "F1 final", "ΔF1", "set-F1", "BLEU-1", "judge",
    "recall init", "recall final", "recall@k init", "recall@k final", "valid calls %",
    "ins/ep", "upd/ep", "del/ep", "growth (words)", "format err %",
)
JUDGE_MAX_TOKENS = 128
"""New tokens of a judge verdict (one sentence and a JSON label)."""


def literature_answer(row: dict[str, Any]) -> str:
    """The answer the literature metrics score: the llm answerer's prediction over the final
    memory, else (retrieval answerer) the top memory retrieved for the question, else ""."""
    if row.get("prediction_final") is not None:
        return str(row["prediction_final"])
    hits = row.get("hits_final") or []
    return hits[0] if hits else ""


def literature_scores(row: dict[str, Any], verdict: str | None = None,
                      judged: bool = False) -> dict[str, float | None]:
    """set-F1 and BLEU-1 of `literature_answer(row)` against the first gold answer (mem0
    compares with one answer); with `judged`, the judge's verdict as 1.0 / 0.0."""
    answer, gold = literature_answer(row), str(row["answers"][0])
    out: dict[str, float | None] = {"set_f1": token_set_f1(answer, gold),
                                    "bleu1": bleu1(answer, gold), "judge": None,
                                    "judge_unreadable": None}
    if judged:
        out["judge"] = float(verdict == "CORRECT")
        out["judge_unreadable"] = float(verdict is None)
    return out


def judge_rows(judge: Generator, rows: Sequence[dict[str, Any]],
               seed: int | None = None) -> list[str | None]:
    """mem0's judge verdict (CORRECT / WRONG / None if unreadable) for each row, asked of
    `judge` through its chat template in one greedy generate call."""
    from memrl.inference.base import SamplingParams, generate_checked
    from memrl.inference.chat import encode_chat

    if not rows:
        return []
    prompts = [encode_chat(judge.tokenizer, judge_prompt(r["question"], str(r["answers"][0]),
                                                         literature_answer(r)))
               for r in rows]
    params = SamplingParams(max_new_tokens=JUDGE_MAX_TOKENS, temperature=0.0, seed=seed)
    return [parse_judge_label(g.text) for g in generate_checked(judge, prompts, params)]


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def aggregate(rows: Sequence[dict[str, Any]], scored: bool = True) -> dict[str, Any]:
    """Means over trajectories (rows of the trajectories file; every sample counts once);
    scores None when not `scored`."""
    m = lambda key: _mean([r["scores"][key] for r in rows])  # noqa: E731
    some = lambda key: _mean([r["scores"][key] for r in rows  # noqa: E731
                              if r["scores"].get(key) is not None])
    info = lambda f: _mean([f(r) for r in rows])  # noqa: E731
    lit = lambda key: _mean([r["literature"][key] for r in rows  # noqa: E731
                             if r["literature"][key] is not None])
    return {
        "n": len(rows),
        "episodes": len({r["id"] for r in rows}),
        "f1_initial": m("score_initial") if scored else None,
        "f1_final": m("score_final") if scored else None,
        "delta": m("delta") if scored else None,
        "set_f1": lit("set_f1") if scored else None,
        "bleu1": lit("bleu1") if scored else None,
        "judge": lit("judge") if scored else None,
        "judge_unreadable": lit("judge_unreadable") if scored else None,
        "reward": _mean([float(r["reward"]) for r in rows]),
        "recall_initial": m("recall_initial"),
        "recall_final": m("recall_final"),
        "recall_at_k_initial": some("recall_at_k_initial"),
        "recall_at_k_final": some("recall_at_k_final"),
        "valid_call_rate": valid_call_rate([r["scores"] for r in rows]),
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
        "memory": memory_per_session(rows),
    }


def table_rows(per_category: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Rows of the results table (scores and recall in %)."""
    pct = lambda v: None if v is None else 100.0 * v  # noqa: E731
    rows = []
    for key, r in per_category.items():
        name = f"{key} {CATEGORY_NAMES[int(key)]}" if key.isdigit() else key
        rows.append([
            name, r["episodes"], pct(r["f1_initial"]), pct(r["f1_final"]), pct(r["delta"]),
            pct(r["set_f1"]), pct(r["bleu1"]), pct(r["judge"]), pct(r["recall_initial"]),
            pct(r["recall_final"]), pct(r["recall_at_k_initial"]), pct(r["recall_at_k_final"]),
            pct(r["valid_call_rate"]), r["inserts"], r["updates"], r["deletes"],
            r["memory_growth_tokens"], pct(r["format_error_rate"]),
        ])
    return rows


LITERATURE_COLUMNS = ("category", "questions", "set-F1", "BLEU-1", "judge", "judge unreadable")


def literature_rows(per_category: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """The compact table papers report: per category and overall, set-F1, BLEU-1 and judge
    accuracy in % (category 5 is not scored)."""
    pct = lambda v: None if v is None else 100.0 * v  # noqa: E731
    return [[f"{key} {CATEGORY_NAMES[int(key)]}" if key.isdigit() else key, r["n"],
             pct(r["set_f1"]), pct(r["bleu1"]), pct(r["judge"]), pct(r["judge_unreadable"])]
            for key, r in per_category.items()]


def check_categories(categories: Sequence[int]) -> list[int]:
    """Sorted unique categories, each 1..5; anything else is a user error."""
    if not categories:
        raise MemrlInputError("give at least one category (1-5)",
                              location="eval.benchmarks.categories")
    bad = [c for c in categories if c not in ALL_CATEGORIES]
    if bad:
        raise MemrlInputError(
            f"unknown category {bad[0]}; LoCoMo has "
            + ", ".join(f"{k} ({v})" for k, v in CATEGORY_NAMES.items()),
            location="eval.benchmarks.categories",
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
    split: str = "all",
    judge: Generator | None = None,
    judge_name: str | None = None,
    resume: bool = False,
    embedder: Embedder | None = None,
    model_name: str | None = None,
    console: Any = None,
    show_progress: bool = True,
    dist: Dist | None = None,
) -> dict[str, Any]:
    """Run the MemoryUpdate agent on prepared LoCoMo episodes; write and return results.

    `data` is a `memrl prepare locomo` directory (precomputed embeddings are used when they
    match the embedder). `split` keeps one side of the training / held-out split; `limit` keeps
    the first K episodes of the chosen categories; `episodes_per_run` episodes run together
    (in lockstep on the HF engine, as independent coroutines on vLLM and the server pool)
    and are appended to trajectories.jsonl together. `judge` (any Generator, e.g.
    a local model or a remote server) adds the LLM-judge accuracy. Finished episodes in
    `out_dir` are reused; `resume=True` additionally requires that there are some. The
    records, their scoring, the aggregate and the report are `LocomoBenchmark`'s.
    """
    categories = check_categories([int(c) for c in categories])
    check_counts(limit=limit, samples=num_samples, episodes_per_run=episodes_per_run)
    split = check_split(split)
    check_data(data)
    config = config.model_copy(
        update={"include_adversarial": ADVERSARIAL_CATEGORY in categories}
    )
    task = MemoryUpdateTask(config, embedder=embedder)
    judge_id = None if judge is None else (
        judge_name or getattr(judge, "name_or_path", None) or type(judge).__name__)
    bench = LocomoBenchmark("locomo", data, limit=limit, categories=categories, split=split,
                            judge=judge, judge_id=judge_id, task=task)
    episodes = bench.records(split)
    run = open_run(out_dir, run_header(
        "locomo", generator, model_name, task.config,
        protocol=f"literature (judge: {judge_id})", data=str(data), split=split,
        categories=categories, limit=limit, num_samples=num_samples,
        num_episodes=len(episodes), embedder=task.embedder.name, judge=judge_id,
        metric="f1_final",
    ), resume=resume, console=console, dist=dist)
    seed = task.config.seed or 0
    by_id = {e.id: e for e in episodes}
    with progress_bars(run.console, show_progress and run.main) as progress:
        bar = progress.add_task("LoCoMo episodes", total=len(episodes) * num_samples)
        rows, elapsed, _ = run_episodes(
            task, generator, episodes, run.out / "trajectories.jsonl", num_samples=num_samples,
            per_run=episodes_per_run, seed_of=lambda i: derive_seed(seed, "locomo", i),
            progress=lambda event: progress.advance(bar, event.episodes),
            add_to_rows=lambda rows: bench.score(rows, by_id),
            console=run.console, dist=run.dist)
    results = bench.aggregate(split, rows, episodes)
    run.results["results"] = results["categories"]
    run.results["timings"] = {"rollout_s": elapsed, "per_episode_s": elapsed / len(episodes)}
    run.finish()
    if run.main:
        bench.report(run, {split: results})
    return run.results


def check_data(data: str | Path) -> Path:
    """The `memrl prepare locomo` directory (or file), which must exist."""
    from memrl.data.locomo import EPISODES_FILE

    data = Path(data)
    if not data.exists():
        raise MemrlInputError("LoCoMo data not found (build it with `memrl prepare locomo`)",
                              location=str(data))
    if data.is_dir() and not (data / EPISODES_FILE).is_file():
        raise MemrlInputError(f"no {EPISODES_FILE} (build it with `memrl prepare locomo`)",
                              location=str(data))
    return data


@dataclass
class LocomoBenchmark:
    """LoCoMo as a `memrl.eval.benchmark.Benchmark`: one slice a conversation split
    (`split`: all, train or held-out), the episodes of `categories` (the first `limit`),
    each row scored as the literature scores it (`literature`: set-F1, BLEU-1 and, with a
    `judge`, mem0's judge) and aggregated per category (`categories`; the headline `score`
    the F1 over the final memory of categories 1-4, in %). It reads the memupdate agent's
    rows (answers over its memory store). With `task` (the MemoryUpdateTask that runs, set
    by `adapt`) the records are its `load` (precomputed embeddings used); without, the
    directory's episodes. `num_docs` is not used:
    LoCoMo has no lengths."""

    name: str
    data_dir: str | Path
    num_docs: Sequence[int] | None = None
    limit: int | None = None
    categories: Sequence[int] = DEFAULT_CATEGORIES
    split: str = "all"
    judge: Generator | None = None
    judge_id: str | None = None
    judge_seed: int = 0
    task: MemoryUpdateTask | None = None
    metric: str = "f1_final"
    records_per_run: int = 32

    def __post_init__(self) -> None:
        check_counts(limit=self.limit)
        self.data_dir = check_data(self.data_dir)
        self.categories = check_categories([int(c) for c in self.categories])
        self.split = check_split(self.split)
        if self.task is not None:
            self.judge_seed = self.task.config.seed or 0

    def slices(self) -> list[int | str]:
        return [self.split]

    @property
    def protocol(self) -> str:
        """How rows are scored (its results.json's `protocol`: a judge is another one)."""
        return f"literature (judge: {self.judge_id})"

    def adapt(self, task: Any) -> MemoryUpdateTask:
        """The memupdate agent's task, answering category 5 when it is asked for."""
        if not isinstance(task, MemoryUpdateTask):
            raise MemrlInputError("the locomo benchmark scores the memupdate agent (answers "
                                  f"over its memory store), not {task.name}", location="agent")
        config = task.config.model_copy(
            update={"include_adversarial": ADVERSARIAL_CATEGORY in self.categories})
        self.task = MemoryUpdateTask(config, embedder=task.embedder, reward=task.weights)
        self.judge_seed = config.seed or 0
        return self.task

    def seed_key(self, key: int | str) -> tuple[Any, ...]:
        """The seeds of `evaluate_locomo`: (seed, "locomo", episode index)."""
        return ("locomo",)

    def records(self, key: int | str) -> list[MemoryEpisode]:
        """The episodes of the split `key` and of the chosen categories (the first `limit`)."""
        loaded = (self.task.load(str(self.data_dir), "locomo", what="evaluation")
                  if self.task is not None else load_episodes(self.data_dir))
        episodes = [e for e in split_by_conversation(loaded, str(key))
                    if e.category in self.categories][:self.limit]
        if not episodes:
            raise MemrlInputError(
                f"no episodes of categories {', '.join(map(str, self.categories))} in split "
                f"{key}", location=str(self.data_dir))
        return episodes

    def score(self, rows: list[dict[str, Any]], records: Mapping[str, Any]) -> None:
        """`literature` of each row (the judge asked once for the rows of categories 1-4)."""
        if any("hits_final" not in r for r in rows):
            raise MemrlInputError("the locomo benchmark scores the memupdate agent (answers "
                                  "over its memory store); run it with agent=memupdate",
                                  location="agent")
        scored = [r for r in rows if r["category"] != ADVERSARIAL_CATEGORY]
        verdicts = dict(zip((id(r) for r in scored),
                            judge_rows(self.judge, scored, self.judge_seed)
                            if self.judge else [], strict=False))
        for r in rows:
            r["literature"] = literature_scores(r, verdicts.get(id(r)), self.judge is not None)

    def aggregate(self, key: int | str, rows: Sequence[Mapping[str, Any]],
                  records: Sequence[Any]) -> dict[str, Any]:
        per_category = aggregate_categories(rows, self.categories)
        overall = (per_category.get("all") or {}).get("f1_final")
        return {"n": len(rows), "score": None if overall is None else 100.0 * overall,
                "categories": per_category}

    def report(self, run: EvalRun, per_slice: dict[str, Any]) -> None:
        for key, results in per_slice.items():
            report(run, results["categories"], str(key), self.judge_id)


def aggregate_categories(rows: Sequence[dict[str, Any]],
                         categories: Sequence[int]) -> dict[str, dict[str, Any]]:
    """`aggregate` per category, and `all` over categories 1-4."""
    per_category: dict[str, dict[str, Any]] = {}
    for c in categories:
        group = [r for r in rows if r["category"] == c]
        if group:
            per_category[str(c)] = aggregate(group, scored=c != ADVERSARIAL_CATEGORY)
    answerable = [r for r in rows if r["category"] != ADVERSARIAL_CATEGORY]
    if answerable:
        per_category["all"] = aggregate(answerable)
    return per_category


def report(run: EvalRun, per_category: dict[str, dict[str, Any]], split: str,
           judge_id: str | None) -> None:
    """results.md and the console tables: ours, the literature's, memory per session (the
    answerer and embedder as the run's header has them)."""
    config = run.results["config"]
    embedder = run.results.get("embedder") or config["embedder"]
    source = ("the llm answerer's answer" if config["answerer"] == "llm"
              else "the top retrieved memory (retrieval answerer: a proxy, not comparable "
              "with published numbers)")
    note = (
        f"\nAnswerer `{config['answerer']}` over the top {config['top_k']} memories "
        f"({embedder}); scores and recall in %, edits and growth per episode. "
        f"Split `{split}`. set-F1 (mem0's token-set F1), BLEU-1 and judge (mem0's judge "
        f"prompt, {judge_id or 'no judge given'}) score {source} against the first gold "
        "answer; category 5 is not scored. See docs/protocols.md.\n"
    )
    literature = literature_rows(per_category)
    note += ("\n## As the literature scores it (mem0)\n\n"
             + markdown_table(LITERATURE_COLUMNS, literature)
             + "\n## Memory per dialogue session read\n\n"
             + markdown_table(SESSION_COLUMNS, session_rows(per_category), digits=2))
    title = f"LoCoMo · MemoryUpdate · {run.results['model']}"
    write_report(run.out, title, TABLE_COLUMNS, table_rows(per_category), run.console, note)
    run.console.print(rich_table(f"LoCoMo as the literature scores it · split {split}",
                                 LITERATURE_COLUMNS, literature))
    for key, r in per_category.items():
        name = f"category {key}" if key.isdigit() else key
        run.console.print(session_line(name, r["memory"]), soft_wrap=True)

"""The long-context baseline: the whole document and the question in one prompt.

MemAgent's Table 2 compares a memory agent with the same model reading the whole context at
once. `evaluate_long_context` does that on the same `eval_{N}.json` files as
`evaluate_ruler_hqa`: one prompt per record (`LONG_CONTEXT_TEMPLATE`: the problem, the article,
"put the answer in \\boxed{}"), greedy by default, scored like MemAgent's training format
(`memagent-boxed`: last \\boxed{}, EM / F1 / one-way sub-EM over all gold answers).

A record whose prompt plus the answer budget exceeds the model's window (`window`, by default
the model's `max_position_embeddings`) is not run: nothing is truncated. Each N reports how
many records fit; its score counts only when every record fits, and the table says "does not
fit" otherwise, so the baseline's curve ends where the model's window does.

Writes into `out_dir`: `answers_{N}.jsonl` (every episode: question, gold, response, answer,
scores, prompt tokens), `results.json` and `results.md`.

`LongContextTask` is the same reader as a one-turn agent, so that any benchmark runs it
through the one runner like any other agent (`memrl eval agent=long-context
eval.benchmarks=[...]`, `memrl.eval.benchmark`): a record that does not fit is not run, and
its row says so (`fits` False; the benchmark reports "does not fit").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from memrl.agents.prompts import fill_template
from memrl.config import StrictModel
from memrl.data.ruler_hqa import load_ruler_hqa, ruler_hqa_path
from memrl.errors import MemrlInputError
from memrl.eval.report import finish_header, write_json, write_jsonl, write_report
from memrl.inference.base import (
    SEED_MAX,
    Generation,
    SamplingParams,
    derive_seed,
    generate_checked,
    response_text,
)
from memrl.inference.chat import encode_chat
from memrl.rewards.qa import extract_boxed, qa_scores

LONG_CONTEXT_TEMPLATE = (
    "You are presented with a problem and an article. Please read the article carefully and "
    "answer the problem, and put the answer in \\boxed{}.\n\n<problem> \n{prompt}\n</problem>"
    "\n\n<article>\n{chunk}\n</article>\n\nYour answer:\n"
)
"""The reader's prompt: MemAgent's final-answer prompt with the article where the memory was."""



class LongContextConfig(StrictModel):
    """How the long-context reader is run."""

    window: int | None = Field(None, ge=2)
    """The model's context window in tokens (prompt + answer); None: the model's
    max_position_embeddings (`model_window`)."""
    max_new_tokens: int = Field(64, ge=1)
    """Tokens allowed for the answer."""
    temperature: float = Field(0.0, ge=0)
    """0: greedy."""
    seed: int | None = Field(0, ge=0, le=SEED_MAX)
    """Base seed of the per-record sampling seeds (unused when greedy)."""


def model_window(model_dir: str | Path) -> int:
    """The context window of a Hugging Face model directory (max_position_embeddings)."""
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    if not isinstance(cfg.get("max_position_embeddings"), int):
        raise MemrlInputError("config.json has no max_position_embeddings: give "
                              "long_context.window", location=str(Path(model_dir) / "config.json"))
    return cfg["max_position_embeddings"]


COLUMNS = ("N", "context tokens", "fit", "EM", "F1", "sub-EM")


def long_context_prompt(tokenizer: Any, question: str, context: str) -> list[int]:
    """Token ids of the reader's prompt through the chat template."""
    return encode_chat(tokenizer, fill_template(LONG_CONTEXT_TEMPLATE, prompt=question,
                                                chunk=context))


def aggregate(rows: Sequence[dict[str, Any]], num_records: int) -> dict[str, Any]:
    """Means over the records that fit; `score` (sub-EM %) only when all of them fit."""
    n = len(rows)
    means = {m: (sum(r["scores"][m] for r in rows) / n if n else None)
             for m in ("em", "f1", "sub_em")}
    fits = n == num_records and n > 0
    return {
        "n": n, "num_records": num_records, "fits": fits, **means,
        "score": 100.0 * means["sub_em"] if fits else None,
        "context_tokens": (sum(r["prompt_tokens"] for r in rows) / n) if n else None,
    }


@dataclass(frozen=True)
class Reply:
    """The reader's reply to one prompt: the generation, its text, the answer in its last
    \\boxed{} and that answer's EM / F1 / sub-EM against the gold answers."""

    generation: Generation
    response: str
    answer: str | None
    scores: dict[str, float]


def read_whole(generator: Any, prompts: Sequence[list[int]],
               answers: Sequence[Sequence[str]], config: LongContextConfig,
               seeds: Sequence[int | None], *, temperature: float | None = None,
               top_p: float | None = None) -> list[Reply | None]:
    """The reader's reply to each prompt that fits the window with the answer budget (in
    one batch), None for each one that does not (nothing is truncated); sampled at the
    config's temperature (or `temperature`), the i-th with `seeds[i]`."""
    budget, window = config.max_new_tokens, config.window or 0
    fit = [i for i, p in enumerate(prompts) if len(p) + budget <= window]
    params = [SamplingParams(max_new_tokens=budget, seed=seeds[i], **({} if top_p is None
                                                                      else {"top_p": top_p}),
                             temperature=config.temperature if temperature is None
                             else temperature) for i in fit]
    generations = generate_checked(generator, [prompts[i] for i in fit], params) if fit else []
    out: list[Reply | None] = [None] * len(prompts)
    for i, g in zip(fit, generations, strict=True):
        response = response_text(generator.tokenizer, g)
        answer = extract_boxed(response)
        out[i] = Reply(g, response, answer, qa_scores(answer, answers[i]))
    return out


def evaluate_long_context(
    generator: Any,
    data_dir: str | Path,
    num_docs_list: Sequence[int],
    *,
    out_dir: str | Path,
    config: LongContextConfig = LongContextConfig(),
    limit: int | None = None,
    model_name: str | None = None,
    console: Any = None,
) -> dict[str, Any]:
    """Answer every record of each `eval_{N}.json` from the whole document; write results."""
    from rich.console import Console

    from memrl.eval.report import run_header

    window, max_new_tokens, seed = config.window, config.max_new_tokens, config.seed
    if window is None:
        raise MemrlInputError("give the model's window (model_window(model_dir))",
                              location="long_context.window")
    if window <= max_new_tokens:
        raise MemrlInputError(f"window {window} leaves no room for the prompt",
                              location="long_context.window")
    data_dir = Path(data_dir)
    for n in num_docs_list:
        if not ruler_hqa_path(data_dir, n).is_file():
            raise MemrlInputError(f"no RULER-HQA file for N={n}",
                                  location=str(ruler_hqa_path(data_dir, n)))
    console = console or Console()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = run_header("long_context", generator, model_name, config,
                         template=LONG_CONTEXT_TEMPLATE, data_dir=str(data_dir),
                         num_docs=list(num_docs_list), limit=limit)
    per_n: dict[str, Any] = {}
    started = time.perf_counter()
    tokenizer = generator.tokenizer
    for n in num_docs_list:
        records = load_ruler_hqa(ruler_hqa_path(data_dir, n), expected_num_docs=n)[:limit]
        prompts = [long_context_prompt(tokenizer, r.question, r.render_context())
                   for r in records]
        t0 = time.perf_counter()
        replies = read_whole(generator, prompts, [r.answers for r in records], config, [
            None if seed is None else derive_seed(seed, "long-context", n, r.id)
            for r in records])
        fit = [i for i, reply in enumerate(replies) if reply is not None]
        rows = [{"id": r.id, "num_docs": n, "question": r.question, "answers": r.answers,
                 "response": reply.response, "answer": reply.answer, "scores": reply.scores,
                 "prompt_tokens": len(p),
                 "truncated": reply.generation.finish_reason == "length"}
                for r, p, reply in zip(records, prompts, replies, strict=True)
                if reply is not None]
        write_jsonl(out / f"answers_{n}.jsonl", rows)
        longest = max((len(p) for p in prompts), default=0)
        per_n[str(n)] = {"num_docs": n, **aggregate(rows, len(records)),
                         "max_prompt_tokens": longest, "seconds": time.perf_counter() - t0}
        console.print(f"N={n}: {len(fit)} of {len(records)} records fit in {window} tokens"
                      + (f", sub-EM {per_n[str(n)]['score']:.1f}" if per_n[str(n)]["fits"]
                         else " (does not fit: not scored)"), soft_wrap=True)
    results["results"] = per_n
    results["timings"] = {"total_s": time.perf_counter() - started}
    finish_header(results)
    write_json(out / "results.json", results)
    title = f"Long-context reader · {results['model']}"
    write_report(out, title, COLUMNS, table_rows(per_n), console,
                 f"\nThe whole document in one prompt (window {window} tokens, answer budget "
                 f"{max_new_tokens}); `fit` = records whose prompt fits; a score only where "
                 "all fit.\n")
    return results


def table_rows(per_n: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Rows of the results table (scores in %; "does not fit" where a record did not)."""
    rows = []
    for key in sorted(per_n, key=int):
        r = per_n[key]
        tokens = None if r["context_tokens"] is None else round(r["context_tokens"])
        fit = f"{r['n']}/{r['num_records']}"
        if r["fits"]:
            rows.append([int(key), tokens, fit,
                         *(100.0 * r[m] for m in ("em", "f1", "sub_em"))])
        else:
            rows.append([int(key), tokens, fit, "does not fit", "", ""])
    return rows



class LongContextTask:
    """The long-context reader as a Task (`memrl.tasks.base.Task`): one turn per episode,
    the whole document and the question in one prompt, scored like `memagent-boxed`
    (EM / F1 / sub-EM of the last \\boxed{}). Evaluation only: it has no training reward
    beyond `em`."""

    name = "long_context"
    config_class = LongContextConfig
    rewards = ("em",)

    def __init__(self, config: LongContextConfig) -> None:
        self.config = config

    @classmethod
    def from_config(cls, config: Any) -> LongContextTask:
        """From a config's `long_context:` section; its window defaults to the model's."""
        section = config.agent_config
        if section.window is None:
            section = section.model_copy(update={"window": model_window(config.model.path)})
        return cls(section)

    def load(self, path: str, fmt: str, *, what: str) -> list[Any]:
        """RULER-HQA's `eval_{N}.json` format (any N)."""
        records = load_ruler_hqa(path)
        if not records:
            raise MemrlInputError(f"{what} file holds no questions", location=path)
        return records

    def rollout(self, generator: Any, records: Sequence[Any], *, num_samples: int,
                seed: int | None, temperature: float | None = None,
                keep_token_ids: bool = True, progress: Any = None,
                top_p: float | None = None, mode: str = "auto") -> list[Any]:
        """One reply per (record, sample) whose prompt fits the window; the others an
        empty trajectory with `fits` 0 in its metrics (nothing is truncated)."""
        from memrl.trajectory import Trajectory, Turn

        episodes = [(r, k) for r in records for k in range(num_samples)]
        prompts = {r.id: long_context_prompt(generator.tokenizer, r.question,
                                             r.render_context()) for r in records}
        replies = read_whole(
            generator, [prompts[r.id] for r, _ in episodes], [r.answers for r, _ in episodes],
            self.config, [None if seed is None else derive_seed(seed, r.id, k)
                          for r, k in episodes], temperature=temperature, top_p=top_p)
        return [self._trajectory(r, k, prompts[r.id], reply, keep_token_ids)
                for (r, k), reply in zip(episodes, replies, strict=True)]

    @staticmethod
    def _trajectory(record: Any, sample: int, prompt: list[int], reply: Reply | None,
                    keep_ids: bool) -> Any:
        from memrl.trajectory import Trajectory, Turn

        base = {"prompt_tokens": float(len(prompt))}
        if reply is None:
            return Trajectory(record_id=record.id, sample_index=sample, reward=0.0,
                              metrics={**base, "fits": 0.0})
        g = reply.generation
        turn = Turn("final", prompt if keep_ids else (), list(g.token_ids) if keep_ids else (),
                    list(g.logprobs) if keep_ids else (), reply.response, g.finish_reason,
                    prompt_tokens=len(prompt), response_tokens=len(g.token_ids))
        return Trajectory(record_id=record.id, sample_index=sample, turns=(turn,),
                          answer=reply.answer, reward=reply.scores["em"],
                          metrics={**reply.scores, **base, "fits": 1.0})

    def summarize(self, trajectories: Sequence[Any]) -> dict[str, float]:
        """The share that fit and the mean EM / F1 / sub-EM over them."""
        ran = [t for t in trajectories if t.metrics.get("fits")]
        if not trajectories:
            return {}
        means = {m: (sum(t.metrics[m] for t in ran) / len(ran) if ran else 0.0)
                 for m in ("em", "f1", "sub_em")}
        return {"fit": len(ran) / len(trajectories), **means}

    def log_row(self, trajectory: Any, record: Any) -> dict[str, Any]:
        """The question, gold, reply, answer and scores of one episode; `fits`."""
        turn = trajectory.turns[0] if trajectory.turns else None
        return {"id": trajectory.record_id, "sample_index": trajectory.sample_index,
                "question": record.question, "answers": record.answers,
                "response": None if turn is None else turn.response_text,
                "answer": trajectory.answer, "fits": turn is not None,
                "prompt_tokens": int(trajectory.metrics["prompt_tokens"]),
                "reward": trajectory.reward, "scores": dict(trajectory.metrics)}

"""The long-context baseline: the whole document and the question in one prompt.

MemAgent's Table 2 compares a memory agent with the same model reading the whole context at
once. `LongContextTask` does that as a one-turn agent, so that any benchmark runs it through
the one runner like any other agent (`memrl eval agent=long-context eval.benchmarks=[...]`,
`memrl.eval.benchmark`): one prompt per record (`LONG_CONTEXT_TEMPLATE`: the problem, the
article, "put the answer in \\boxed{}"), greedy by default, scored like MemAgent's training
format (`memagent-boxed`: last \\boxed{}, EM / F1 / one-way sub-EM over all gold answers).

A record whose prompt plus the answer budget exceeds the model's window (`window`, by default
the model's `max_position_embeddings`) is not run: nothing is truncated, and its row says so
(`fits` False); the benchmark reports "does not fit" for its N and no score, so the
baseline's curve ends where the model's window does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from memrl.agents.prompts import fill_template
from memrl.config import StrictModel
from memrl.data.ruler_hqa import load_ruler_hqa
from memrl.errors import MemrlInputError
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

    @model_validator(mode="after")
    def _room_for_a_prompt(self) -> LongContextConfig:
        if self.window is not None and self.window <= self.max_new_tokens:
            raise ValueError(f"window {self.window} leaves no room for the prompt (max_new_tokens "
                             f"{self.max_new_tokens})")
        return self


def model_window(model_dir: str | Path) -> int:
    """The context window of a Hugging Face model directory (max_position_embeddings)."""
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    if not isinstance(cfg.get("max_position_embeddings"), int):
        raise MemrlInputError("config.json has no max_position_embeddings: give "
                              "long_context.window", location=str(Path(model_dir) / "config.json"))
    return cfg["max_position_embeddings"]




def long_context_prompt(tokenizer: Any, question: str, context: str) -> list[int]:
    """Token ids of the reader's prompt through the chat template."""
    return encode_chat(tokenizer, fill_template(LONG_CONTEXT_TEMPLATE, prompt=question,
                                                chunk=context))


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

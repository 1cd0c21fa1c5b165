"""A plain prompt → answer task, as a memrl plug-in (`agent: prompt_task:PromptTask`).

What `trl_side_by_side.py` trains on both sides: one conversation per sample (one prompt,
one sampled answer, no memory, no chunks), the job TRL's `GRPOTrainer` does. memrl has no
built-in single-turn task (its agents are MemAgent and MemoryUpdate), so this is the public
plug-in route of `memrl.tasks` (docs/architecture.md, "Agents as plug-ins"): a Task class
named by import path, with its own config section (`prompt:`), no edit to memrl.

Records are JSON lines `{"id": str, "prompt": str, "answers": [str, ...]}`; `prompt` is
the final text, chat template included, tokenized as TRL tokenizes a plain-text prompt
(`tokenizer(text)["input_ids"]`), so both frameworks see the same prompt token ids.

The reward is `parity_reward`: the parity of a CRC-32 of the answer's token ids. It is
deterministic, cheap, independent of the answer's length, the same function on both sides,
and gives every group of a random-weight model (which never answers) non-zero advantages;
it measures speed, not learning.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from memrl.errors import MemrlInputError
from memrl.inference.base import Sampler, episode_keys
from memrl.inference.schedule import ModelCalls, run_episodes
from memrl.tasks import RolloutSpec, Sampling, Task
from memrl.trajectory import Trajectory, generated_turn


def parity_reward(token_ids: Sequence[int]) -> float:
    """1.0 when the CRC-32 of the ids (4-byte little-endian each) is odd, else 0.0."""
    data = b"".join(int(t).to_bytes(4, "little", signed=True) for t in token_ids)
    return float(zlib.crc32(data) & 1)


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    """One prompt: its id, its full text (chat template included) and gold answers."""

    id: str
    prompt: str
    answers: tuple[str, ...] = ()


def load_prompts(path: str | Path) -> list[PromptRecord]:
    """The records of a JSON-lines file (one clear error per malformed line)."""
    records, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MemrlInputError(f"not JSON ({exc.msg})", location=where) from None
            if not isinstance(row, dict) or not isinstance(row.get("id"), str) \
                    or not isinstance(row.get("prompt"), str):
                raise MemrlInputError('need {"id": str, "prompt": str, ...}', location=where)
            answers = row.get("answers", [])
            if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                raise MemrlInputError("answers must be a list of strings", location=where)
            if row["id"] in seen:
                raise MemrlInputError(f"duplicate id {row['id']!r}", location=where)
            seen.add(row["id"])
            records.append(PromptRecord(row["id"], row["prompt"], tuple(answers)))
    return records


def save_prompts(records: Sequence[PromptRecord], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({"id": r.id, "prompt": r.prompt, "answers": list(r.answers)})
                    + "\n")


class PromptConfig(BaseModel):
    """The `prompt:` section of a config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(256, ge=1)
    """Tokens sampled per answer."""
    ignore_eos: bool = True
    """Sample past EOS: every answer has exactly max_new_tokens tokens (as TRL's answers
    with vLLM's `ignore_eos`, or transformers' `min_new_tokens`)."""
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0)


class PromptTask(Task):
    name: ClassVar[str] = "prompt"
    config_class: ClassVar[type] = PromptConfig
    reward_functions: ClassVar[dict[str, Any]] = {"parity": lambda t, record: t.metrics["parity"]}

    def load(self, path: str, fmt: str, *, what: str) -> list[PromptRecord]:
        records = load_prompts(path)
        if not records:
            raise MemrlInputError(f"{what} file holds no prompts", location=path)
        return records

    def sampling(self) -> Sampling:
        return Sampling(self.config.temperature, self.config.top_p)

    def play(self, engine: Any, records: Sequence[PromptRecord], spec: RolloutSpec,
             sampler: Sampler) -> list[Trajectory]:
        """One answer per (record, sample), seeded by the episode key alone (one call, and
        `ignore_eos`: a driver of its own rather than `Task.episode`)."""
        keys = iter(episode_keys([r.id for r in records], spec.num_samples))
        episodes = [partial(self.answer, record, next(keys), sampler, spec.keep_token_ids)
                    for record in records for _ in range(spec.num_samples)]
        return run_episodes(engine, episodes, spec.mode)

    async def answer(self, record: PromptRecord, key: tuple[str, int, int], sample: Sampler,
                     keep_ids: bool, calls: ModelCalls) -> Trajectory:
        prompt = list(sample.generator.tokenizer(record.prompt)["input_ids"])
        params = dataclasses.replace(sample.params(self.config.max_new_tokens, *key),
                                     ignore_eos=self.config.ignore_eos)
        gen = await calls.generate(prompt, params)
        turn = generated_turn("answer", prompt, gen, keep_ids=keep_ids)
        return Trajectory(record.id, key[2], (turn,), answer=gen.text,
                          metrics={"parity": parity_reward(gen.token_ids)})

    def score(self, trajectory: Trajectory, record: PromptRecord) -> Trajectory:
        """Scored in the episode (the parity of the answer's ids, kept or not)."""
        return trajectory

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        if not trajectories:
            return {}
        return {"parity": sum(t.metrics["parity"] for t in trajectories) / len(trajectories)}

    def log_row(self, trajectory: Trajectory, record: PromptRecord) -> dict[str, Any]:
        return {"id": trajectory.record_id, "sample_index": trajectory.sample_index,
                "answer": trajectory.answer, "reward": trajectory.reward,
                "scores": dict(trajectory.metrics)}

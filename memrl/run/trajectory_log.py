"""Per-trajectory training records: one JSONL row per trajectory per step.

With `trainer.log_trajectories` on, step k of `memrl train` writes
`train_trajectories/step_{k:06d}.jsonl` in the run directory: a row for every trajectory the
step trained on, gathered from every data-parallel rank onto the main rank, in the step's
group order (the order one process would hold them), samples of a group by index. To audit
or debug a run as verl users do with its rollout dump. A row:

    step               the training step (as in metrics.jsonl)
    id, sample_index   the question (GRPO group) and which of its samples
    reward             the task's reward
    kl_penalty         what rl.use_kl_in_reward subtracted (0 without it); the advantage
                       is computed from reward - kl_penalty over the group
    advantage          the trajectory's advantage, given to every conversation
    num_conversations  its conversations (turns)
    conversations      per conversation: kind, prompt_tokens, response_tokens, truncated,
                       logprob_mean (the old log-probs the update uses: the trainer's, or
                       the engine's with rl.use_rollout_logprobs), rollout_logprob_mean
                       (the engine's), entropy_mean (the trainer's; None when it did not
                       recompute the log-probs)
    logprob_mean, entropy_mean   the same means over all its response tokens
    answer, gold       the extracted final answer (None: none) and the gold answers
    scores             the task's scores of the trajectory

Size: `max_rows_per_step` rows a step (whole groups), `max_bytes` for the whole run; a
resumed run removes the files of steps after its checkpoint and counts what is left.
`memrl view RUN_DIR` lists them, a step at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from memrl.distributed import Dist
from memrl.rl.maths.batch import RolloutBatch
from memrl.run.trajectory_files import (
    TRAJECTORY_DIR,
    read_step_files,
    remove_steps_after,
    step_file,
    step_files,
)

__all__ = [
    "TRAJECTORY_DIR",
    "TrajectoryLog",
    "read_step_files",
    "remove_steps_after",
    "step_file",
    "take_whole_groups",
    "trajectory_rows",
]

def _mean(values: Sequence[float] | Tensor | None) -> float | None:
    if values is None or len(values) == 0:
        return None
    return float(torch.as_tensor(values, dtype=torch.float64).mean())


def trajectory_rows(
    step: int,
    trajectories: Sequence[Any],
    batch: RolloutBatch,
    task_rewards: Tensor,
    gold: Mapping[str, Sequence[str]],
    entropies: Sequence[Tensor] | None = None,
) -> list[dict[str, Any]]:
    """One row per trajectory of this rank's `batch` (built from `trajectories`, in order),
    whose rewards may include a KL penalty (`task_rewards`: before it), with advantages and
    old log-probs set; `entropies` per conversation, or None."""
    if batch.advantages is None or batch.old_logprobs is None:
        raise ValueError("the batch needs its old log-probs and advantages")
    convs: list[list[dict[str, Any]]] = [[] for _ in trajectories]
    tokens: list[dict[str, list[Tensor]]] = [{"lp": [], "ent": []} for _ in trajectories]
    for i, s in enumerate(batch.conversations):
        old = batch.old_logprobs[i]
        ent = entropies[i] if entropies else None
        convs[s.traj_index].append({
            "kind": s.turn_kind,
            "prompt_tokens": len(s.prompt_ids),
            "response_tokens": len(s.response_ids),
            "truncated": s.truncated,
            "logprob_mean": _mean(old),
            "rollout_logprob_mean": _mean(s.rollout_logprobs),
            "entropy_mean": _mean(ent),
        })
        tokens[s.traj_index]["lp"].append(old.reshape(-1))
        if ent is not None:
            tokens[s.traj_index]["ent"].append(ent.reshape(-1))
    rows = []
    for k, t in enumerate(trajectories):
        lp, ent = tokens[k]["lp"], tokens[k]["ent"]
        rows.append({
            "step": step,
            "id": t.record_id,
            "sample_index": t.sample_index,
            "reward": float(task_rewards[k]),
            "kl_penalty": float(task_rewards[k] - batch.rewards[k]),
            "advantage": float(batch.advantages[k]),
            "num_conversations": len(convs[k]),
            "conversations": convs[k],
            "logprob_mean": _mean(torch.cat(lp)) if lp else None,
            "entropy_mean": _mean(torch.cat(ent)) if ent else None,
            "answer": t.answer,
            "gold": list(gold.get(t.record_id, [])),
            "scores": dict(t.metrics),
        })
    return rows


def take_whole_groups(rows: Sequence[dict[str, Any]], max_rows: int) -> list[dict[str, Any]]:
    """The rows of the first groups (by `id`, in order of first appearance) that fit in
    `max_rows` together; a group that would pass it is left out, and so is every later one."""
    sizes: dict[str, int] = {}
    for row in rows:
        sizes[row["id"]] = sizes.get(row["id"], 0) + 1
    kept, total = set(), 0
    for group, size in sizes.items():
        if total + size > max_rows:
            break
        kept.add(group)
        total += size
    return [row for row in rows if row["id"] in kept]


class TrajectoryLog:
    """Writes the step files of one run (only the main rank writes; every rank gathers)."""

    def __init__(
        self,
        out_dir: str | Path,
        *,
        max_rows_per_step: int,
        max_bytes: int,
        gold: Mapping[str, Sequence[str]],
        dist: Dist = Dist(),
        warn: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.max_rows_per_step = max_rows_per_step
        self.max_bytes = max_bytes
        self.gold = gold
        self.dist = dist
        self.warn = warn
        self.full = False
        self._bytes: int | None = None

    @classmethod
    def from_config(cls, config: Any, out_dir: str | Path, *, rows_per_step: int,
                    records: Sequence[Any], dist: Dist = Dist(),
                    warn: Callable[[str], None] = lambda text: None) -> TrajectoryLog | None:
        """The log of `trainer.log_trajectories` (a TrajectoryLogConfig) for a run whose
        steps have `rows_per_step` trajectories of `records`; None when it is off."""
        if not config.active(rows_per_step):
            return None
        log = cls(out_dir, max_rows_per_step=config.max_rows_per_step,
                  max_bytes=config.max_bytes, gold={}, dist=dist, warn=warn)
        log.add_records(records)
        return log

    def add_records(self, records: Sequence[Any]) -> None:
        """Know the gold answers of `records` too (a curriculum stage's questions)."""
        self.gold = {**self.gold,
                     **{r.id: [str(a) for a in getattr(r, "answers", None) or []]
                        for r in records}}

    def written_bytes(self) -> int:
        """Bytes of the run's step files (counted on disk once, then added up)."""
        if self._bytes is None:
            self._bytes = sum(p.stat().st_size for p in step_files(self.out_dir).values())
        return self._bytes

    def write(
        self,
        step: int,
        trajectories: Sequence[Any],
        batch: RolloutBatch,
        task_rewards: Tensor,
        group_order: Sequence[str],
        entropies: Sequence[Tensor] | None = None,
    ) -> Path | None:
        """Gather this step's rows from every rank and write them (main rank); returns the
        file written, None when nothing was (another rank, the size cap reached, or not one
        whole group within max_rows_per_step)."""
        from memrl.eval.resume import encode_text
        from memrl.fileio import write_atomic

        mine = trajectory_rows(step, trajectories, batch, task_rewards, self.gold, entropies)
        parts = self.dist.all_gather(mine)
        if not self.dist.is_main or self.full:
            return None
        where = {g: i for i, g in enumerate(group_order)}
        rows = sorted((r for part in parts for r in part),
                      key=lambda r: (where.get(r["id"], len(where)), r["sample_index"]))
        rows = take_whole_groups(rows, self.max_rows_per_step)
        if not rows:
            return None
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        payload = encode_text(text)
        if self.written_bytes() + len(payload) > self.max_bytes:
            self.full = True
            self.warn(f"trajectory records stop at step {step}: "
                      f"trainer.log_trajectories.max_bytes ({self.max_bytes}) reached")
            return None
        path = step_file(self.out_dir, step)
        write_atomic(path, payload)
        self._bytes = self.written_bytes() + len(payload)
        return path

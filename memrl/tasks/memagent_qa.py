"""MemAgent on long-document QA: chunked reading, overwritten memory, boxed answer.

The task owns what the agent leaves open: it extracts the answer from the final response
(the last `\\boxed{}`), scores it (EM, F1, sub-EM against every gold answer) and turns one
score into the reward. Training and `memrl eval` both roll out through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from memrl.agents.memagent import MemAgent, MemAgentConfig
from memrl.data.records import QARecord, supporting_facts
from memrl.errors import MemrlInputError
from memrl.agents.oracle import OracleGenerator
from memrl.inference.base import Generator, Sampler
from memrl.rewards.evidence import locate_evidence
from memrl.rewards.memagent import extract_answer_is, memagent_em, memagent_protocol_scores
from memrl.rewards.qa import extract_boxed, qa_scores
from memrl.rewards.shaping import context_overlap_reward
from memrl.tasks.base import RolloutSpec, Sampling, Task
from memrl.tasks.rewards import RewardFunction, reward_means
from memrl.trajectory import Trajectory

REWARDS = ("sub_em", "em", "f1", "memagent_em", "context_overlap")
"""Rewards of the final answer; memagent_em is MemAgent's published training reward
(`memrl.rewards.memagent.memagent_em` of the final response); context_overlap is a dense
smoke-test reward for tiny random models (memrl.rewards.shaping), not a measure of answer
quality."""


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    name: (lambda t, record, name=name: t.metrics[name]) for name in REWARDS}
"""Each reward is the trajectory's score of that name (scored in `rollout`)."""


PROTOCOLS = ("memagent-boxed", "memagent")
"""How the final answer is asked for and scored (docs/protocols.md).

`memagent-boxed` (default; the training format): boxed final prompt, the last `\\boxed{}`,
EM / F1 / one-way sub-EM, best over every gold answer (memrl.rewards.qa).
`memagent`: MemAgent's published RULER-HQA evaluation: the "Therefore, the answer is" final
prompt (preset `memagent-answer-is`), question and context stripped, `</think>` cut,
`extract_answer_is`, SQuAD EM, bidirectional sub-EM and HotpotQA F1 (per item, rounded to 2
decimals) against answers[0] only (memrl.rewards.memagent.memagent_protocol_scores)."""

PROTOCOL_PROMPTS = {"memagent": "memagent-answer-is"}
"""The prompt preset a protocol imposes (the others keep the config's prompts)."""

SCORE_KEYS = ("em", "f1", "sub_em", "strict_sub_em", "f1_unrounded", "prediction_empty",
              "empty_credited", "dropped_by_published_mean")
"""Per-trajectory scores a trajectories file keeps (the last five: protocol `memagent` only)."""


@dataclass(frozen=True)
class EvidenceTrace:
    """What the task found while scoring with `trace_evidence` (`Trajectory.scoring`)."""

    evidence: dict[str, Any]
    """Where the gold answer and each supporting fact enter the chunked context
    (`memrl.rewards.evidence.locate_evidence`)."""


def score_protocol_trajectory(trajectory: Trajectory, record: QARecord) -> Trajectory:
    """Protocol `memagent`: a copy with the answer (`extract_answer_is`) and the published
    scores plus their strict companions and flags (as 0.0 / 1.0) in `metrics`."""
    s = memagent_protocol_scores(trajectory.details.final_response, record.answers)
    scores = {"em": s.em, "f1": s.f1, "sub_em": s.sub_em, "strict_sub_em": s.strict_sub_em,
              "f1_unrounded": s.f1_unrounded, "prediction_empty": float(s.prediction_empty),
              "empty_credited": float(s.empty_credited),
              "dropped_by_published_mean": float(s.dropped_by_published_mean)}
    return dataclasses.replace(trajectory, answer=s.prediction,
                               metrics={**trajectory.metrics, **scores})


def score_trajectory(trajectory: Trajectory, record: QARecord,
                     answer_format: str = "boxed") -> Trajectory:
    """A copy with the answer (the last \\boxed{} of the final response; with answer_format
    `answer_is`, the text after the last "the answer is") and its QA scores in `metrics`."""
    reply = trajectory.details.final_response
    answer = extract_answer_is(reply) if answer_format == "answer_is" else extract_boxed(reply)
    return dataclasses.replace(trajectory, answer=answer,
                               metrics={**trajectory.metrics, **qa_scores(answer, record.answers)})


def trajectory_row(t: Trajectory, record: QARecord) -> dict[str, Any]:
    """One line of a trajectories file (no context: it is in the data file)."""
    updates = [turn for turn in t.turns if turn.kind == "memory_update"]
    final = next(turn for turn in t.turns if turn.kind == "final")
    details = t.details
    return {
        "id": t.record_id,
        "sample_index": t.sample_index,
        "num_docs": record.num_docs or 0,
        "question": record.question,
        "answers": record.answers,
        "memories": list(details.memories),
        "memory_tokens": [turn.response_tokens for turn in updates],
        "memory_truncated": [turn.truncated for turn in updates],
        "final_response": details.final_response,
        "final_truncated": final.truncated,
        "answer": t.answer,
        "scores": {k: t.metrics[k] for k in SCORE_KEYS if k in t.metrics},
        "num_chunks": details.num_chunks,
        "context_tokens": details.context_tokens,
        "capped": details.capped,
        **({"evidence": t.scoring.evidence} if isinstance(t.scoring, EvidenceTrace) else {}),
    }


class MemAgentQATask(Task):
    """Reward: em / f1 / sub_em of the \\boxed{} answer, or the dense context_overlap."""

    name: ClassVar[str] = "memagent"
    config_class: ClassVar[type] = MemAgentConfig
    rewards: ClassVar[tuple[str, ...]] = REWARDS
    reward_functions: ClassVar[Mapping[str, RewardFunction]] = REWARD_FUNCTIONS

    def __init__(self, config: MemAgentConfig, reward: str | Mapping[str, float] | None = "sub_em",
                 protocol: str = PROTOCOLS[0], *, trace_evidence: bool = False) -> None:
        """`trace_evidence`: also record in each trajectory (`scoring`, an EvidenceTrace,
        and its log row) the chunk where the gold answer and each supporting fact enter the context
        (`memrl.rewards.evidence.locate_evidence`), for the evaluation's memory diagnostics;
        it cuts each context into chunks a second time."""
        if protocol not in PROTOCOLS:
            raise MemrlInputError(
                f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}",
                location="protocol",
            )
        if protocol in PROTOCOL_PROMPTS:
            config = config.model_copy(update={"prompts": PROTOCOL_PROMPTS[protocol]})
        super().__init__(config, reward)
        self.protocol = protocol
        self.trace_evidence = trace_evidence
        self._context_ids: dict[str, frozenset[int]] = {}

    def load(self, path: str, fmt: str, *, what: str) -> list[QARecord]:
        if fmt == "ruler":
            from memrl.data.ruler_hqa import load_ruler_hqa

            records = load_ruler_hqa(path)
        else:
            from memrl.data.hotpotqa import load_hotpotqa

            records = load_hotpotqa(path, format=fmt)
        if not records:
            raise MemrlInputError(f"{what} file holds no questions", location=path)
        return records

    def sampling(self) -> Sampling:
        """The section's own sampling (what `memrl eval` and `memrl ask` sample with)."""
        return Sampling(self.config.temperature, self.config.top_p)

    def prepare(self, records: Sequence[QARecord]) -> list[QARecord]:
        """Protocol `memagent` strips the question and the context (as get_pred does)."""
        if self.protocol != "memagent":
            return list(records)
        return [r.model_copy(update={"question": r.question.strip(),
                                     "context": r.render_context().strip()}) for r in records]

    def play(self, engine: Generator, records: Sequence[QARecord], spec: RolloutSpec,
             sampler: Sampler) -> list[Trajectory]:
        """MemAgent's episodes (its own driver: chunks, then the final answer)."""
        agent = MemAgent(engine, self.config, sampler=sampler)
        trajectories = agent.run(records, num_samples=spec.num_samples, progress=spec.progress,
                                 keep_token_ids=spec.keep_token_ids, mode=spec.mode)
        if isinstance(engine, OracleGenerator):  # the warm start's oracle
            trajectories = engine.without_mistakes(trajectories)
        return trajectories

    def score_all(self, engine: Generator, trajectories: Sequence[Trajectory],
                  records: Mapping[str, QARecord], spec: RolloutSpec) -> list[Trajectory]:
        """The protocol's answer and scores, the scores the chosen rewards need, and (with
        `trace_evidence`) where the evidence enters the context."""
        chunker = MemAgent(engine, self.config)
        evidence = {r.id: EvidenceTrace(locate_evidence(chunker.chunk(r).texts, r.answers,
                                                        supporting_facts(r)))
                    for r in records.values()} if self.trace_evidence else {}
        fmt = self.config.resolved_prompts.answer_format
        score = score_protocol_trajectory if self.protocol == "memagent" else (
            lambda t, r: score_trajectory(t, r, fmt))
        return [self._scored(score(t, records[t.record_id]), records[t.record_id],
                             engine.tokenizer, evidence.get(t.record_id))
                for t in trajectories]

    def _scored(self, t: Trajectory, record: QARecord, tokenizer: Any,
                evidence: EvidenceTrace | None) -> Trajectory:
        """The scored trajectory `t` with the scores its rewards need (and `evidence`, when
        traced)."""
        metrics = dict(t.metrics)
        if "memagent_em" in self.weights:
            metrics["memagent_em"] = memagent_em(t.details.final_response, record.answers)
        if "context_overlap" in self.weights:
            metrics["context_overlap"] = self._overlap(t, record, tokenizer)
        return dataclasses.replace(t, metrics=metrics, scoring=evidence)

    def oracle(self, tokenizer: Any, records: Sequence[QARecord]) -> Generator:
        """The warm start's teacher (`memrl.agents.oracle.OracleGenerator`): memories of the
        facts the question needs as they appear, then the gold answer where the prompts ask
        for it (`answer_format`)."""
        return OracleGenerator(tokenizer, records, self.config)

    def replay(self, tokenizer: Any, record: QARecord, row: dict[str, Any]) -> Trajectory:
        """A `memrl eval` trajectories line as a Trajectory of this agent's prompts
        (`memrl.agents.oracle.replay_memagent`)."""
        from memrl.agents.oracle import replay_memagent

        return replay_memagent(OracleGenerator(tokenizer, [], self.config).agent, record, row)

    def _overlap(self, trajectory: Trajectory, record: QARecord, tokenizer: Any) -> float:
        if record.id not in self._context_ids:
            ids = tokenizer.encode(record.render_context(), add_special_tokens=False)
            self._context_ids[record.id] = frozenset(ids)
        response = trajectory.turns[-1].response_ids
        return context_overlap_reward(response, self._context_ids[record.id])

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        if not trajectories:
            return {}
        mean = lambda key: float(np.mean([t.metrics.get(key, 0.0) for t in trajectories]))  # noqa: E731
        return {
            "accuracy": mean("sub_em"),
            "em": mean("em"),
            "f1": mean("f1"),
            "no_answer": float(np.mean([t.answer is None for t in trajectories])),
            "chunks_per_episode": float(
                np.mean([t.details.num_chunks for t in trajectories])
            ),
            **(reward_means(trajectories) if len(self.weights) > 1 else {}),
        }

    def log_row(self, trajectory: Trajectory, record: QARecord) -> dict[str, Any]:
        return {**trajectory_row(trajectory, record), "reward": trajectory.reward}

"""MemoryUpdate on LoCoMo: tool calls on a forked memory, rewarded by the QA improvement.

Per rollout: make sure each episode's base namespace exists (its initial memory, created
once per process from precomputed embeddings when `prepare locomo embed=true` wrote them),
run the agent (one trial namespace per sample), score the question over the base and over
each trial (`memrl.rewards.memory_delta`), set `reward` and `metrics`, then release the
trials. Category-5 (adversarial) episodes are left out of `load` unless
`memupdate.include_adversarial` is set, and score 0 over any memory when they are in.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from memrl.agents.memupdate import (
    MemoryUpdateAgent,
    MemUpdateConfig,
    create_base_namespace,
    make_embedder,
    memory_diff,
    memory_texts,
)
from memrl.data.locomo import (
    EPISODES_FILE,
    META_FILE,
    EmbeddingIndex,
    MemoryEpisode,
    load_embeddings,
    load_episodes,
    load_locomo,
    parse_dia_ids,
)
from memrl.errors import MemrlInputError
from memrl.inference.base import Generator, Sampler
from memrl.inference.schedule import ProgressEvent
from memrl.memory.embedder import Embedder
from memrl.memory.store import MemoryBackend, MemoryStore
from memrl.rewards.locomo_metrics import compression_reward
from memrl.tasks.base import RolloutSpec, Sampling, Task, report
from memrl.rewards.memory_delta import (
    efficiency_factor,
    error_rate,
    evidence_recall,
    evidence_recall_at_k,
    llm_answer_scores,
    memory_delta_reward,
    retrieval_answer_score,
)
from memrl.trajectory import Trajectory

FORMATS = ("auto", "locomo")
_OP_METRICS = {"insert": "inserts", "update": "updates", "delete": "deletes",
               "search": "searches"}
MAX_BASE_NAMESPACES = 256
"""Base namespaces kept in memory at once (each holds ~250 facts of 384 floats); the least
recently used are released and rebuilt on demand."""


@dataclass(frozen=True)
class MemoryScore:
    """What the answerer made of one memory for one question."""

    score: float
    hits: list[str]
    """Texts of the top-k memories retrieved for the question, best first."""
    recall: float
    """1.0 if a hit covers an evidence turn (`evidence_recall`)."""
    prediction: str | None = None
    """The llm answerer's answer (None for the retrieval answerer)."""
    recall_at_k: float | None = None
    """Share of the evidence turns held by the hits (`evidence_recall_at_k`)."""


@dataclass(frozen=True)
class MemoryScoring:
    """What the task found while scoring a trajectory (`Trajectory.scoring`)."""

    memory_diff: dict[str, Any]
    """What changed between the base memory and the trial's (`memory_diff`)."""
    initial: MemoryScore
    """The answerer over the base memory."""
    final: MemoryScore
    """The answerer over the trial memory."""
    llm_answerer: bool
    """Whether the answerer is the policy (then its predictions are logged)."""


def evidence_texts(episode: MemoryEpisode) -> list[str]:
    """Texts of the dialogue turns the episode's evidence ids point to."""
    wanted = set(episode.evidence)
    return [t.text for t in episode.dialogue if t.dia_id in wanted]


def evidence_turn_texts(episode: MemoryEpisode) -> list[list[str]]:
    """Per evidence turn, the texts that stand for it: the turn's own text and the LoCoMo
    observation facts written from it (`MemoryEpisode.dialogue_facts`)."""
    evidence = set(episode.evidence)
    texts = {t.dia_id: [t.text] for t in episode.dialogue if t.dia_id in evidence}
    wanted = {ids[0]: d for d in texts if len(ids := parse_dia_ids(d)) == 1}
    for fact in episode.dialogue_facts:
        for ids in parse_dia_ids(fact.source):
            if ids in wanted:
                texts[wanted[ids]].append(fact.text)
    return [texts[d] for d in episode.evidence if d in texts]


def score_memories(
    store: MemoryBackend,
    namespaces: Sequence[str],
    episodes: Sequence[MemoryEpisode],
    config: MemUpdateConfig,
    generator: Generator | None = None,
    *,
    seed: int | None = None,
) -> list[MemoryScore]:
    """Score episode i's question over namespace i with the configured answerer.

    Adversarial episodes score 0 (the retrieval answerer cannot judge "not mentioned"); their
    hits and recall are still reported.
    """
    if len(namespaces) != len(episodes):
        raise ValueError(f"{len(namespaces)} namespaces for {len(episodes)} episodes")
    hits = [
        [r.text for r, _ in store.search(ns, ep.question, config.top_k)]
        for ns, ep in zip(namespaces, episodes, strict=True)
    ]
    recalls = [
        evidence_recall(h, evidence_texts(ep), config.recall_threshold)
        for h, ep in zip(hits, episodes, strict=True)
    ]
    at_k = [
        evidence_recall_at_k(h, evidence_turn_texts(ep), config.recall_threshold)
        for h, ep in zip(hits, episodes, strict=True)
    ]
    scores: list[float] = [0.0] * len(episodes)
    predictions: list[str | None] = [None] * len(episodes)
    if config.answerer == "retrieval":
        for i, (h, ep) in enumerate(zip(hits, episodes, strict=True)):
            if not ep.adversarial:
                scores[i] = retrieval_answer_score(h, ep.answers)
    else:
        if generator is None:
            raise ValueError("the llm answerer needs a generator")
        todo = [i for i, ep in enumerate(episodes) if not ep.adversarial]
        answered = llm_answer_scores(
            generator,
            [episodes[i].question for i in todo],
            [hits[i] for i in todo],
            [episodes[i].answers for i in todo],
            max_new_tokens=config.answer_max_tokens,
            seed=seed,
        )
        for i, (score, prediction) in zip(todo, answered, strict=True):
            scores[i], predictions[i] = score, prediction
    return [
        MemoryScore(s, h, r, p, k)
        for s, h, r, p, k in zip(scores, hits, recalls, predictions, at_k, strict=True)
    ]


def qa_gain(trajectory: Trajectory, episode: MemoryEpisode) -> float:
    """QA over the final memory minus over the initial one, scaled by the efficiency factor
    when positive (`memory_delta_reward` without a format penalty)."""
    m = trajectory.metrics
    return memory_delta_reward(m["score_initial"], m["score_final"], m["efficiency"], 0.0, 0.0)


def valid_call_rate(metrics: Sequence[dict[str, float]]) -> float | None:
    """Of every tool call the replies attempted, the share that parsed and passed the schema
    (`tool_calls` / (`tool_calls` + `malformed_calls`), pooled); None when none was tried."""
    ok = sum(m.get("tool_calls", 0.0) for m in metrics)
    tried = ok + sum(m.get("malformed_calls", 0.0) for m in metrics)
    return ok / tried if tried else None


class MemoryUpdateTask(Task):
    """The Task the trainer runs for `agent: memupdate` (see memrl.tasks.base.Task)."""

    name: ClassVar[str] = "memupdate"
    config_class: ClassVar[type] = MemUpdateConfig
    rewards: ClassVar[tuple[str, ...]] = ("memory_delta", "qa_gain", "qa_final", "compression",
                                          "format_errors")
    """memory_delta (the default) is the section's `reward_form` with its format penalty:
    `qa_gain − format_penalty · format_errors` (delta) or `qa_final + compression −
    format_penalty · format_errors` (compression). The parts, to weigh in `rl.reward`
    yourself: qa_gain (QA over the final memory minus over the initial one, scaled by the
    efficiency factor when positive), qa_final (QA over the final memory), compression
    (compression_beta · (1 − memory words / dialogue words), Mem-α), format_errors (minus the
    share of replies with a format error)."""

    def __init__(
        self,
        config: MemUpdateConfig | None = None,
        *,
        embedder: Embedder | None = None,
        max_base_namespaces: int = MAX_BASE_NAMESPACES,
        reward: str | dict[str, float] | None = None,
    ) -> None:
        """`reward`: `rl.reward` (a name of `rewards`, or {name: weight}; None: memory_delta)."""
        super().__init__(config or MemUpdateConfig(), reward)
        if max_base_namespaces < 1:
            raise ValueError(f"max_base_namespaces must be >= 1, got {max_base_namespaces}")
        self.reward_functions = {
            "memory_delta": self._memory_delta, "qa_gain": qa_gain,
            "qa_final": lambda t, ep: t.metrics["score_final"],
            "compression": self._compression,
            "format_errors": lambda t, ep: -t.metrics["format_error_rate"]}
        self.embedder = embedder if embedder is not None else make_embedder(self.config.embedder)
        self.store: MemoryBackend
        if self.config.store == "ray":  # one actor for every rank, each under its own prefix
            from memrl.distributed import Dist
            from memrl.memory.ray_store import shared_store

            rank = Dist.from_environment().rank
            self.store = shared_store(self.embedder, self.config.store_actor, f"rank{rank}:")
        else:
            self.store = MemoryStore(self.embedder)
        self.max_base_namespaces = max_base_namespaces
        self._indexes: dict[str, EmbeddingIndex] = {}
        self._bases: OrderedDict[str, None] = OrderedDict()
        self._initial: dict[str, MemoryScore] = {}
        """Retrieval scores of base memories (deterministic, so computed once per episode)."""

    # ---- data -------------------------------------------------------------------------

    def load(self, path: str, fmt: str, *, what: str) -> list[MemoryEpisode]:
        """Episodes of a `memrl prepare locomo` directory (or its episodes.jsonl, or a raw
        locomo10.json), without adversarial ones unless the config includes them."""
        if fmt not in FORMATS:
            raise MemrlInputError(
                f"the memupdate agent reads LoCoMo episodes; format must be one of "
                f"{', '.join(FORMATS)}, got {fmt!r}",
                location="data.format",
            )
        p = Path(path)
        directory: Path | None = None
        if p.is_dir():
            directory = p
            episodes = load_episodes(p)
        elif p.is_file() and p.name == EPISODES_FILE:
            directory = p.parent
            episodes = load_episodes(p.parent)
        elif p.is_file() and p.suffix == ".json":
            episodes, _ = load_locomo(p)
        elif p.exists():
            raise MemrlInputError(
                f"expected a `memrl prepare locomo` directory, its {EPISODES_FILE}, or a "
                "LoCoMo .json file", location=str(p))
        else:
            raise MemrlInputError(f"{what} data not found", location=str(p))
        if not self.config.include_adversarial:
            episodes = [e for e in episodes if not e.adversarial]
        if not episodes:
            raise MemrlInputError(
                f"{what} data holds no episodes"
                + ("" if self.config.include_adversarial else " besides adversarial ones"),
                location=str(p),
            )
        if directory is not None and (directory / META_FILE).is_file():
            index = self._precomputed(directory, episodes)
            if index is not None:
                for e in episodes:
                    self._indexes[e.id] = index
        return episodes

    def _precomputed(self, directory: Path, episodes: list[MemoryEpisode]) -> EmbeddingIndex | None:
        """The directory's embeddings when they were made by this task's embedder."""
        index = load_embeddings(directory, episodes)
        if index.embedder_name != self.embedder.name or index.dim != self.embedder.dim:
            warnings.warn(
                f"{directory / META_FILE}: embeddings were made with {index.embedder_name} "
                f"(dim {index.dim}), not {self.embedder.name} (dim {self.embedder.dim}); "
                "embedding the initial memories again",
                stacklevel=3,
            )
            return None
        return index

    def ensure_bases(self, episodes: Sequence[MemoryEpisode]) -> None:
        """Create the missing base namespaces; release the least recently used others."""
        pinned = {e.id for e in episodes}
        for e in episodes:
            if e.id in self._bases:
                self._bases.move_to_end(e.id)
                continue
            create_base_namespace(self.store, e, self._indexes.get(e.id))
            self._bases[e.id] = None
        for old in list(self._bases):
            if len(self._bases) <= self.max_base_namespaces:
                break
            if old not in pinned:
                del self._bases[old]
                self.store.release(old, missing_ok=True)

    # ---- rollouts -----------------------------------------------------------------------

    def sampling(self) -> Sampling:
        """The section's own sampling (what `memrl eval` samples with)."""
        return Sampling(self.config.temperature, self.config.top_p)

    def play(self, engine: Generator, records: Sequence[MemoryEpisode], spec: RolloutSpec,
             sampler: Sampler) -> list[Trajectory]:
        """The tool agent's episodes, each in a trial namespace forked from its episode's
        base namespace (made here when missing); `score_all` releases the trials."""
        self.ensure_bases(records)
        report(spec, ProgressEvent("start", episodes=len(records) * spec.num_samples))
        agent = MemoryUpdateAgent(engine, self.store, self.config)
        return agent.run(records, spec.num_samples, keep_token_ids=spec.keep_token_ids,
                         mode=spec.mode, sampler=sampler)

    def score_all(self, engine: Generator, trajectories: Sequence[Trajectory],
                  records: Mapping[str, MemoryEpisode], spec: RolloutSpec) -> list[Trajectory]:
        """Scored trajectories (their trials released); a "final" ProgressEvent for each
        once the batch is scored."""
        try:
            scored = self._score(trajectories, list(records.values()), engine, spec.seed)
        finally:
            for t in trajectories:
                self.store.release(t.details.namespace, missing_ok=True)
        for t in scored:
            report(spec, ProgressEvent("final", episodes=1, turn=t.turns[-1] if t.turns else None))
        return scored

    def _initial_scores(
        self, episodes: Sequence[MemoryEpisode], generator: Generator, seed: int
    ) -> dict[str, MemoryScore]:
        cfg = self.config
        if cfg.answerer == "retrieval":
            todo = [e for e in episodes if e.id not in self._initial]
            for e, s in zip(todo, score_memories(self.store, [e.id for e in todo], todo, cfg),
                            strict=True):
                self._initial[e.id] = s
            return {e.id: self._initial[e.id] for e in episodes}
        # The llm answerer is the current policy: its initial answers change as it trains.
        scored = score_memories(self.store, [e.id for e in episodes], episodes, cfg, generator,
                                seed=seed)
        return {e.id: s for e, s in zip(episodes, scored, strict=True)}

    def _score(
        self,
        trajectories: Sequence[Trajectory],
        records: Sequence[MemoryEpisode],
        generator: Generator,
        seed: int | None,
    ) -> list[Trajectory]:
        """Scored copies of `trajectories` (answer, metrics, `MemoryScoring`)."""
        cfg = self.config
        by_id = {r.id: r for r in records}
        unique = list({r.id: r for r in records}.values())
        initial = self._initial_scores(unique, generator, seed)
        episodes = [by_id[t.record_id] for t in trajectories]
        finals = score_memories(
            self.store, [t.details.namespace for t in trajectories], episodes, cfg, generator,
            seed=seed,
        )
        base_texts: dict[str, dict[str, str]] = {}
        scored = []
        for t, ep, final in zip(trajectories, episodes, finals, strict=True):
            if ep.id not in base_texts:
                base_texts[ep.id] = memory_texts(self.store, ep.id)
            diff = memory_diff(base_texts[ep.id], memory_texts(self.store, t.details.namespace))
            scoring = MemoryScoring(diff, initial[ep.id], final, cfg.answerer == "llm")
            scored.append(self._rewarded(t, ep, scoring))
        return scored

    def _rewarded(self, t: Trajectory, ep: MemoryEpisode, scoring: MemoryScoring) -> Trajectory:
        """`t` with its answer and metrics from the answerer's scores (the reward parts read
        them: `reward_functions`)."""
        cfg, d = self.config, t.details
        init, final = scoring.initial, scoring.final
        growth = d.memory_after["tokens"] - d.memory_before["tokens"]
        eff = efficiency_factor(growth, cfg.efficiency_budget, cfg.efficiency_scale)
        rate = error_rate(d.format_error_turns, d.turns)
        metrics = {
            "score_initial": init.score,
            "score_final": final.score,
            "delta": final.score - init.score,
            "efficiency": eff,
            "format_errors": float(sum(d.format_errors.values())),
            "format_error_rate": rate,
            "recall_initial": init.recall,
            "recall_final": final.recall,
            **({"recall_at_k_initial": init.recall_at_k, "recall_at_k_final": final.recall_at_k}
               if final.recall_at_k is not None and init.recall_at_k is not None else {}),
            "tool_calls": float(sum(d.ops.values()) + d.invalid_calls),
            "malformed_calls": float(sum(n for kind, n in d.format_errors.items()
                                         if kind != "too_many_calls")),
            "memory_growth_tokens": float(growth),
            "turns": float(d.turns),
            **{_OP_METRICS[op]: float(n) for op, n in d.ops.items()},
        }
        answer = final.prediction if scoring.llm_answerer else t.answer
        return dataclasses.replace(t, answer=answer, metrics=metrics, scoring=scoring)

    def _memory_delta(self, t: Trajectory, ep: MemoryEpisode) -> float:
        """The section's `reward_form`, minus its format penalty (`rewards`)."""
        cfg, m = self.config, t.metrics
        if cfg.reward_form == "compression":
            words = sum(len(turn.text.split()) for turn in ep.dialogue)
            return compression_reward(
                m["score_final"], t.details.memory_after["tokens"], max(words, 1),
                cfg.compression_beta) - cfg.format_penalty * m["format_error_rate"]
        return memory_delta_reward(m["score_initial"], m["score_final"], m["efficiency"],
                                   m["format_error_rate"], cfg.format_penalty)

    def _compression(self, t: Trajectory, ep: MemoryEpisode) -> float:
        """Mem-α's compression term alone (`compression_reward` of a QA score of 0)."""
        words = sum(len(turn.text.split()) for turn in ep.dialogue)
        return compression_reward(0.0, t.details.memory_after["tokens"], max(words, 1),
                                  self.config.compression_beta)

    def oracle(self, tokenizer: Any, records: Sequence[MemoryEpisode]) -> Generator:
        """The warm start's teacher (`memrl.agents.memupdate_oracle`): each piece's LoCoMo
        observation facts inserted through valid tool calls, then a reply without a call."""
        from memrl.agents.memupdate_oracle import memupdate_oracle

        return memupdate_oracle(tokenizer, records, self.config)

    # ---- reporting ----------------------------------------------------------------------

    def summarize(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Means over trajectories: reward parts, edits per episode, growth, format errors."""
        if not trajectories:
            return {}
        keys = ("score_initial", "score_final", "delta", "efficiency", "format_error_rate",
                "recall_initial", "recall_final", "memory_growth_tokens", "turns",
                "inserts", "updates", "deletes", "searches")
        out = {k: float(np.mean([t.metrics.get(k, 0.0) for t in trajectories])) for k in keys}
        for k in ("recall_at_k_initial", "recall_at_k_final"):
            values = [t.metrics[k] for t in trajectories if k in t.metrics]
            if values:
                out[k] = float(np.mean(values))
        rate = valid_call_rate([t.metrics for t in trajectories])
        if rate is not None:
            out["valid_call_rate"] = rate
        out["format_error_traj_frac"] = float(
            np.mean([t.metrics.get("format_errors", 0.0) > 0 for t in trajectories])
        )
        return out

    def log_row(self, trajectory: Trajectory, record: MemoryEpisode) -> dict[str, Any]:
        """Question, gold, the calls made, what changed in memory, scores and reward."""
        d, scoring = trajectory.details, trajectory.scoring
        return {
            "id": trajectory.record_id,
            "sample_index": trajectory.sample_index,
            "category": record.category,
            "question": record.question,
            "answers": record.answers,
            "evidence": record.evidence,
            "reward": trajectory.reward,
            "scores": trajectory.metrics,
            "turns": d.turns,
            "ops": d.ops,
            "format_errors": d.format_errors,
            "failed_calls": d.failed_calls,
            "calls": list(d.calls[:50]),
            "memory_before": d.memory_before,
            "memory_after": d.memory_after,
            "memory_diff": scoring.memory_diff if scoring else None,
            "hits_initial": scoring.initial.hits if scoring else None,
            "hits_final": scoring.final.hits if scoring else None,
            **({"prediction_initial": scoring.initial.prediction,
                "prediction_final": scoring.final.prediction}
               if scoring and scoring.llm_answerer else {}),
            "responses": [turn.response_text for turn in trajectory.turns],
        }

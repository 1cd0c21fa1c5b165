"""MemoryUpdateTask: loading, rewards on real LoCoMo episodes with scripted agents, the llm
answerer, namespace bookkeeping, and 2 GRPO steps end to end with the tiny model."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

from memrl.agents.memupdate import MemUpdateConfig
from memrl.config import load_config
from memrl.data.locomo import (
    DialogueTurn,
    MemoryEpisode,
    MemoryFact,
    load_locomo,
    precompute_embeddings,
    save_episodes,
)
from memrl.errors import MemrlInputError
from memrl.eval.report import read_jsonl
from memrl.inference.base import request_params
from memrl.inference.scripted import ScriptedGenerator
from memrl.memory.embedder import HashingEmbedder
from memrl.recipes import grpo
from memrl.recipes.config import TrainConfig
from memrl.run.metrics import read_metrics
from memrl.tasks import build_task
from memrl.tasks.memupdate_locomo import MemoryUpdateTask, evidence_texts

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "memupdate_locomo.yaml"
PENALTY = 0.1


def make_episode(eid: str, lines: list[str], memory: list[str], **kw) -> MemoryEpisode:
    dialogue = [
        DialogueTurn(session=1, dia_id=f"D1:{k + 1}", speaker="Ann" if k % 2 == 0 else "Bob",
                     text=text, date="1 May 2023")
        for k, text in enumerate(lines)
    ]
    fields = dict(
        id=eid, sample_id="conv-x", qa_index=0, question="What is the secret code?",
        answers=["4417"], category=4, adversarial=False, evidence=["D1:1"],
        evidence_sessions=[1], dialogue=dialogue,
        initial_memory=[MemoryFact(text=t, source="D9:1") for t in memory],
    )
    fields.update(kw)
    return MemoryEpisode(**fields)


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def is_first_reply(prompt: str) -> bool:
    """The last message is the user's (not a tool response)."""
    return prompt.rsplit("<|im_start|>", 2)[-2].startswith("user")


# ---- real LoCoMo: the three scripted agents of the acceptance ---------------------------


@pytest.fixture(scope="module")
def real_dir(shared_data, tmp_path_factory) -> Path:
    """50 non-adversarial LoCoMo episodes (a fixed random sample), prepared in-process."""
    episodes, _ = load_locomo(shared_data / "locomo" / "locomo10.json")
    answerable = [e for e in episodes if not e.adversarial]
    sample = random.Random(0).sample(answerable, 50)
    d = tmp_path_factory.mktemp("locomo50")
    save_episodes(sample, d)
    return d


def real_task(**config) -> MemoryUpdateTask:
    # 1024 hashing buckets: fewer collisions than the default 256, still instant.
    cfg = MemUpdateConfig(embedder="hashing", format_penalty=PENALTY, **config)
    return MemoryUpdateTask(cfg, embedder=HashingEmbedder(1024))


def test_inserting_the_evidence_turn_has_positive_mean_reward(real_dir, tiny_tokenizer):
    task = real_task(max_response_tokens=4096, max_parallel_calls=10)
    episodes = task.load(str(real_dir), "locomo", what="training")
    assert len(episodes) == 50
    current: dict[str, MemoryEpisode] = {}

    def respond(prompt: str) -> str:
        if not is_first_reply(prompt):
            return "Done."
        ep = current["episode"]
        turns = [t for t in ep.dialogue if t.dia_id in ep.evidence]
        assert all(f"[{t.dia_id}] {t.speaker}: {t.text}" in prompt for t in turns)
        return "".join(call("memory_insert", text=f"{t.speaker}: {t.text}") for t in turns)

    gen = ScriptedGenerator(tiny_tokenizer, respond)
    trajectories = []
    for ep in episodes:  # one episode per rollout: the script must know which evidence
        current["episode"] = ep
        trajectories += task.rollout(gen, [ep], num_samples=1, seed=0)
    rewards = [t.reward for t in trajectories]
    summary = task.summarize(trajectories)
    print(f"\ninsert evidence: mean reward {np.mean(rewards):.4f}, summary {summary}")
    assert np.mean(rewards) > 0
    assert summary["inserts"] == pytest.approx(
        np.mean([len(evidence_texts(e)) for e in episodes]))
    assert summary["recall_final"] > summary["recall_initial"]
    assert summary["format_error_rate"] == 0.0
    assert task.store.namespaces() == sorted(e.id for e in episodes)  # trials released


def test_deleting_everything_has_negative_mean_reward(real_dir, tiny_tokenizer):
    task = real_task(memory_view_k=10_000, max_parallel_calls=10_000,
                     max_response_tokens=100_000)
    episodes = task.load(str(real_dir), "locomo", what="training")

    def respond(prompt: str) -> str:
        if not is_first_reply(prompt):
            return "Done."
        ids = [line[1:].split("]", 1)[0] for line in prompt.splitlines()
               if line.startswith("[m")]
        return "".join(call("memory_delete", id=i) for i in ids)

    gen = ScriptedGenerator(tiny_tokenizer, respond)
    trajectories = task.rollout(gen, episodes, num_samples=1, seed=0)
    rewards = [t.reward for t in trajectories]
    print(f"\ndelete everything: mean reward {np.mean(rewards):.4f}")
    assert gen.calls == [50, 50]  # lockstep: all episodes in each call
    assert all(t.details.memory_after["count"] == 0 for t in trajectories)
    assert all(t.metrics["score_final"] == 0.0 for t in trajectories)
    assert np.mean(rewards) < 0


def test_garbage_earns_exactly_the_format_penalty(real_dir, tiny_tokenizer):
    task = real_task(max_turns=2)
    episodes = task.load(str(real_dir), "locomo", what="training")
    gen = ScriptedGenerator(tiny_tokenizer, lambda p: "<tool_call>memory please</tool_call>")
    trajectories = task.rollout(gen, episodes, num_samples=2, seed=0)
    assert len(trajectories) == 100
    assert all(t.reward == -PENALTY for t in trajectories)
    assert all(t.metrics["delta"] == 0.0 for t in trajectories)


# ---- loading --------------------------------------------------------------------------


def small_episodes() -> list[MemoryEpisode]:
    return [
        make_episode("conv-x-qa0-aaaaaaaa", ["The secret code is 4417.", "Got it."],
                     ["Ann likes tea.", "Bob runs on Sundays."]),
        make_episode("conv-x-qa1-bbbbbbbb", ["I moved to Oslo.", "Nice!"],
                     ["Ann likes tea."], question="Where did Ann move?", answers=["Oslo"]),
        make_episode("conv-x-qa2-cccccccc", ["Hello.", "Hi."], ["Ann likes tea."],
                     question="What is Bob's dog called?", answers=["Rex"], category=5,
                     adversarial=True),
    ]


def test_load_skips_adversarial_unless_included(tmp_path):
    save_episodes(small_episodes(), tmp_path)
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"))
    assert len(task.load(str(tmp_path), "locomo", what="training")) == 2
    assert len(task.load(str(tmp_path / "episodes.jsonl"), "auto", what="training")) == 2
    with_adv = MemoryUpdateTask(MemUpdateConfig(embedder="hashing", include_adversarial=True))
    assert len(with_adv.load(str(tmp_path), "locomo", what="training")) == 3


def test_load_errors(tmp_path):
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"))
    with pytest.raises(MemrlInputError, match="data.format"):
        task.load(str(tmp_path), "ruler", what="training")
    with pytest.raises(MemrlInputError, match="training data not found"):
        task.load(str(tmp_path / "nope"), "locomo", what="training")
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(MemrlInputError, match="prepare locomo"):
        task.load(str(tmp_path / "x.txt"), "locomo", what="training")
    save_episodes(small_episodes()[2:], tmp_path)  # only an adversarial one
    with pytest.raises(MemrlInputError, match="besides adversarial"):
        task.load(str(tmp_path), "locomo", what="validation")


def test_load_reads_a_raw_locomo_json(shared_data):
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"))
    episodes = task.load(str(shared_data / "locomo" / "locomo10.json"), "auto", what="training")
    assert episodes and not any(e.adversarial for e in episodes)


class CountingEmbedder(HashingEmbedder):
    def __init__(self, dim=64):
        super().__init__(dim)
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts += list(texts)
        return super().embed(texts)


def test_precomputed_embeddings_are_used_when_they_match(tmp_path, tiny_tokenizer):
    episodes = small_episodes()
    save_episodes(episodes, tmp_path)
    precompute_embeddings(episodes, HashingEmbedder(64), tmp_path)
    embedder = CountingEmbedder(64)
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"), embedder=embedder)
    loaded = task.load(str(tmp_path), "locomo", what="training")
    task.ensure_bases(loaded)
    assert embedder.texts == []  # the initial memories came from the file
    assert task.store.exists(loaded[0].id)

    other = CountingEmbedder(32)  # another embedder: the file is ignored, with a warning
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"), embedder=other)
    with pytest.warns(UserWarning, match="embedding the initial memories again"):
        loaded = task.load(str(tmp_path), "locomo", what="training")
    task.ensure_bases(loaded)
    assert "Ann likes tea." in other.texts


def test_base_namespaces_are_bounded_lru(tiny_tokenizer):
    episodes = small_episodes()[:2] + [make_episode("conv-x-qa9-dddddddd", ["a"], ["b"])]
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing"), max_base_namespaces=2)
    gen = ScriptedGenerator(tiny_tokenizer, lambda p: "ok")
    for ep in episodes:
        task.rollout(gen, [ep], num_samples=1, seed=0)
    assert task.store.namespaces() == sorted(e.id for e in episodes[1:])
    task.rollout(gen, episodes, num_samples=1, seed=0)  # a batch is never evicted from
    assert len(task.store.namespaces()) == 3


# ---- rewards, metrics, logs ------------------------------------------------------------


def test_rollout_rewards_and_log_rows(tiny_tokenizer):
    ep = small_episodes()[0]
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing", format_penalty=0.2))
    texts = iter(["The secret code is 4417.", "Bob hums."])

    def respond(prompt):
        return call("memory_insert", text=next(texts)) if is_first_reply(prompt) else "Done."

    gen = ScriptedGenerator(tiny_tokenizer, respond)
    good, bad = task.rollout(gen, [ep], num_samples=2, seed=0)
    assert good.metrics["score_initial"] == 0.0 and good.metrics["score_final"] == 1.0
    assert good.reward == 1.0 and good.metrics["recall_final"] == 1.0
    assert bad.reward == 0.0 and bad.metrics["recall_final"] == 0.0
    assert good.metrics["inserts"] == 1.0 and good.metrics["memory_growth_tokens"] == 5.0
    assert good.scoring.memory_diff["added_texts"] == [
        {"id": "m2", "text": "The secret code is 4417."}]
    summary = task.summarize([good, bad])
    assert summary["score_final"] == 0.5 and summary["inserts"] == 1.0
    assert summary["format_error_rate"] == 0.0
    row = task.log_row(good, ep)
    json.dumps(row)
    assert row["question"] == ep.question and row["answers"] == ["4417"]
    assert row["calls"][0]["name"] == "memory_insert" and row["reward"] == 1.0
    assert row["memory_diff"]["added"] == 1
    assert task.store.namespaces() == [ep.id]


def test_efficiency_discounts_a_bloated_memory(tiny_tokenizer):
    ep = small_episodes()[0]
    cfg = MemUpdateConfig(embedder="hashing", efficiency_budget=5, efficiency_scale=10)
    task = MemoryUpdateTask(cfg)
    filler = " ".join(["filler"] * 10)

    def respond(prompt):
        if is_first_reply(prompt):
            return (call("memory_insert", text="The secret code is 4417.")
                    + call("memory_insert", text=filler))
        return "Done."

    (t,) = task.rollout(ScriptedGenerator(tiny_tokenizer, respond), [ep], num_samples=1, seed=0)
    # growth 15 words, budget 5, scale 10: efficiency exp(-1)
    assert t.metrics["memory_growth_tokens"] == 15.0
    assert t.reward == pytest.approx(np.exp(-1.0))


def test_compression_reward_form_is_mem_alphas(tiny_tokenizer):
    """reward_form=compression: QA over the final memory + beta * (1 - memory words /
    dialogue words) (Mem-alpha), minus the format penalty; hand values."""
    ep = small_episodes()[0]
    words = sum(len(turn.text.split()) for turn in ep.dialogue)
    cfg = MemUpdateConfig(embedder="hashing", reward_form="compression", compression_beta=0.5)
    task = MemoryUpdateTask(cfg)

    def respond(prompt):
        return (call("memory_insert", text="The secret code is 4417.")
                if is_first_reply(prompt) else "Done.")

    (t,) = task.rollout(ScriptedGenerator(tiny_tokenizer, respond), [ep], num_samples=1, seed=0)
    memory_words = t.details.memory_after["tokens"]
    assert t.metrics["score_final"] == 1.0
    assert t.reward == pytest.approx(1.0 + 0.5 * (1 - memory_words / words))


def test_adversarial_episodes_score_zero(tiny_tokenizer):
    ep = small_episodes()[2]
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing", include_adversarial=True))

    def respond(prompt):
        return call("memory_insert", text="Bob's dog is Rex.") if is_first_reply(prompt) else "."

    (t,) = task.rollout(ScriptedGenerator(tiny_tokenizer, respond), [ep], num_samples=1, seed=0)
    assert t.metrics["score_initial"] == t.metrics["score_final"] == 0.0 and t.reward == 0.0


def test_llm_answerer_uses_the_generator(tiny_tokenizer):
    ep = small_episodes()[0]
    task = MemoryUpdateTask(MemUpdateConfig(embedder="hashing", answerer="llm"))
    sizes = []

    def respond(prompt):
        if "Answer the question using only the memories" in prompt:
            return "\\boxed{4417}" if "4417" in prompt else "\\boxed{unknown}"
        return (call("memory_insert", text="The secret code is 4417.")
                if is_first_reply(prompt) else "Done.")

    class Recording(ScriptedGenerator):
        def generate(self, prompts, params):
            sizes.append((len(prompts), request_params(prompts, params)[0].temperature))
            return super().generate(prompts, params)

    (t,) = task.rollout(Recording(tiny_tokenizer, respond), [ep], num_samples=1, seed=0)
    assert t.metrics["score_initial"] == 0.0 and t.metrics["score_final"] == 1.0
    assert t.scoring.initial.prediction == "unknown" and t.scoring.final.prediction == "4417"
    assert sizes[-2:] == [(1, 0.0), (1, 0.0)]  # initial and final answers, greedy
    assert task.log_row(t, ep)["prediction_final"] == "4417"


# ---- training ---------------------------------------------------------------------------


def test_build_task():
    cfg = load_config(TrainConfig, CONFIG, ["model.path=m", "memupdate.embedder=hashing"])
    task = build_task(cfg)
    assert isinstance(task, MemoryUpdateTask)
    assert (cfg.rollout.temperature, cfg.rollout.top_p) == (1.0, 1.0)  # configs/memupdate
    assert task.embedder.name == "hashing-256"


def test_a_reward_with_no_meaning_for_memupdate_is_rejected():
    """rl.reward selects the answer score of memagent; for memupdate it is an error, not
    silently ignored."""
    load_config(TrainConfig, CONFIG, ["model.path=m", "rl.reward=memory_delta"])
    with pytest.raises(MemrlInputError, match="no meaning for agent memupdate"):
        load_config(TrainConfig, CONFIG, ["model.path=m", "rl.reward=f1"])


@pytest.mark.parametrize("estimator", ["grpo", "gae"])  # gae: each tool turn a conversation
def test_two_training_steps_end_to_end(estimator, tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    train = [
        make_episode(f"conv-t-qa{i}-0000000{i}", [f"My code is {i}{i}17.", "Noted.", "Bye."],
                     ["Ann likes tea.", "Bob runs."], answers=[f"{i}{i}17"])
        for i in range(4)
    ]
    save_episodes(train, data)
    out = tmp_path / "run"
    cfg = load_config(TrainConfig, CONFIG, [
        f"model.path={tiny_model_dir}", f"data.train_file={data}", f"data.val_file={data}",
        "data.val_limit=2", f"trainer.out_dir={out}", "trainer.total_steps=2",
        "trainer.log_sinks=[jsonl]", "trainer.test_freq=0", "trainer.save_freq=0",
        "trainer.num_logged_trajectories=2", "rollout.n=2", "memupdate.embedder=hashing",
        "memupdate.max_response_tokens=12", "memupdate.session_chunk_turns=2",
        "memupdate.memory_view_k=2", "memupdate.max_tool_response_length=200",
        f"rl.adv_estimator={estimator}",
    ])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. torch / transformers deprecations
        grpo.train(cfg)
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "train/reward_mean" in r]
    assert len(rows) == 2
    for r in rows:
        assert np.isfinite(r["train/reward_mean"]) and r["train/samples"] >= 8
        assert "train/score_final" in r and "train/format_error_rate" in r
        assert np.isfinite(r["actor/pg_loss"])
        if estimator == "gae":
            assert np.isfinite(r["critic/vf_loss"]) and np.isfinite(r["critic/values_mean"])
    logged = read_jsonl(out / "val_samples" / "step_000002.jsonl")
    assert len(logged) == 2 and {"question", "calls", "memory_diff", "reward"} <= set(logged[0])
    assert (out / "checkpoints" / "latest").exists()

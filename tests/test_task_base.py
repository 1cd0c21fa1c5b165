"""The Task base class: the driver seeds each episode call, progress events, the rollout's
sampling, typed abilities, and MemoryUpdate's reward as named parts."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ScriptedAsyncEngine, locomo_episode, tool_reply
from pydantic import BaseModel

from memrl.agents.memupdate import MemUpdateConfig
from memrl.data.records import QARecord
from memrl.inference.base import derive_seed
from memrl.memory.embedder import HashingEmbedder
from memrl.tasks import CanReplay, HasOracle, RendersRows, RolloutSpec, Task
from memrl.tasks.memagent_qa import MemAgentQATask
from memrl.tasks.memupdate_locomo import MemoryUpdateTask


class EchoConfig(BaseModel):
    max_new_tokens: int = 4


class TwoCalls(Task):
    """Asks twice; the reward is 1 when the second reply is longer than the first."""

    name = "echo"
    config_class = EchoConfig
    reward_functions = {"longer": lambda t, r: t.metrics["longer"]}

    async def episode(self, record, model):
        first = await model.generate(model.chat(record.question), max_new_tokens=4)
        second = await model.generate(model.chat(first or "again"), max_new_tokens=6,
                                      kind="again")
        return (first, second)

    def score(self, trajectory, record):
        first, second = trajectory.details
        return dataclasses.replace(trajectory, metrics={"longer": float(len(second) > len(first))})


def records() -> list[QARecord]:
    return [QARecord(id=f"q{i}", question=f"Question {i}?", answers=["x"], context="c")
            for i in range(2)] + [QARecord(id="q0", question="Question 0?", answers=["x"],
                                           context="c")]


def test_the_driver_seeds_call_t_of_each_episode_by_its_key(tiny_tokenizer):
    seen = []

    def respond(prompt, seed):
        seen.append(seed)
        return "ab" * (seed % 3)

    engine = ScriptedAsyncEngine(tiny_tokenizer, respond)
    events = []
    spec = RolloutSpec(num_samples=2, seed=11, temperature=0.5, top_p=0.8, mode="lockstep",
                       progress=events.append)
    trajectories = TwoCalls(EchoConfig()).rollout(engine, records(), spec)
    keys = [("q0", 0, 0), ("q0", 0, 1), ("q1", 0, 0), ("q1", 0, 1), ("q0", 1, 0), ("q0", 1, 1)]
    assert [(t.record_id, t.sample_index) for t in trajectories] == [(k[0], k[2]) for k in keys]
    # lockstep: the first calls of every episode in one batch, then the second calls
    assert seen == [derive_seed(11, *k, 0) for k in keys] + [derive_seed(11, *k, 1) for k in keys]
    assert [[u.kind for u in t.turns] for t in trajectories] == [["turn", "again"]] * 6
    assert all(t.reward == t.metrics["reward/longer"] for t in trajectories)
    assert [e.kind for e in events] == ["start"] + ["final"] * 6 and events[0].episodes == 6


def test_the_spec_samples_else_the_tasks_sampling(tiny_tokenizer):
    params = []

    class Recording(ScriptedAsyncEngine):
        def reply(self, prompt, p):
            params.append((p.temperature, p.top_p, p.max_new_tokens))
            return super().reply(prompt, p)

    engine = Recording(tiny_tokenizer, lambda prompt, seed: "ok")
    task = TwoCalls(EchoConfig())
    task.rollout(engine, records()[:1], RolloutSpec(temperature=0.3, top_p=0.5))
    task.rollout(engine, records()[:1], RolloutSpec())
    assert params == [(0.3, 0.5, 4), (0.3, 0.5, 6), (1.0, 1.0, 4), (1.0, 1.0, 6)]
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        task.rollout(engine, records(), RolloutSpec(num_samples=0))


def test_abilities_are_typed_protocols():
    memagent = MemAgentQATask(MemAgentQATask.config_class())
    assert isinstance(memagent, HasOracle) and isinstance(memagent, CanReplay)
    assert not isinstance(TwoCalls(EchoConfig()), HasOracle | CanReplay)
    assert not issubclass(MemAgentQATask, RendersRows)


@pytest.mark.parametrize("form, parts", [
    ("delta", {"qa_gain": 1.0, "format_errors": 0.1}),
    ("compression", {"qa_final": 1.0, "compression": 1.0, "format_errors": 0.1}),
])
def test_memory_delta_is_the_sum_of_its_named_parts(tiny_tokenizer, form, parts):
    cfg = MemUpdateConfig(embedder="hashing", max_turns=3, session_chunk_turns=2,
                          max_response_tokens=24, memory_view_k=3, reward_form=form,
                          format_penalty=0.1)
    episodes = [locomo_episode("e0", 3), locomo_episode("e1", 7)]
    spec = RolloutSpec(num_samples=2, seed=7, mode="lockstep")
    rewards = {}
    for reward in (None, parts):
        task = MemoryUpdateTask(cfg, embedder=HashingEmbedder(), reward=reward)
        engine = ScriptedAsyncEngine(tiny_tokenizer, tool_reply, seed=5)
        rewards[str(reward)] = [t.reward for t in task.rollout(engine, episodes, spec)]
    whole, summed = rewards.values()
    assert summed == pytest.approx(whole) and len(set(whole)) > 1

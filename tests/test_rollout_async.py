"""Async episodes: the same trajectories as lockstep for the same seeds, with real overlap.

A scripted async engine (tests/helpers.py) replies with a deterministic function of (prompt
ids, seed) and answers concurrent requests in a random order; seeds are per request, keyed
by (episode, turn), so the schedule must not change a single token.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from helpers import WORDS, ScriptedAsyncEngine, assert_same_trajectories, tool_reply
from helpers import locomo_episode as episode

from memrl.agents.memagent import MemAgent, MemAgentConfig, ProgressEvent
from memrl.agents.memupdate import MemoryUpdateAgent, MemUpdateConfig, create_base_namespace
from memrl.config import load_config
from memrl.data.records import QARecord
from memrl.errors import MemrlInputError
from memrl.inference.base import (
    Engine,
    SamplingParams,
    batch_params,
    derive_seed,
    episode_keys,
    request_params,
    run_concurrently,
    runs_async,
)
from memrl.inference.scripted import ScriptedGenerator
from memrl.memory.embedder import HashingEmbedder
from memrl.memory.store import MemoryStore
from memrl.recipes.config import TrainConfig
from memrl.tasks.memagent_qa import MemAgentQATask



def memagent_reply(prompt: str, seed: int | None) -> str:
    rng = random.Random(f"{seed}/{prompt}")
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 6)))
    if "Your answer:" in prompt:  # the final turn: sometimes no \boxed{}
        return f"I think \\boxed{{{rng.choice(WORDS)}}}" if rng.random() < 0.7 else words
    return words


def records_of_lengths(*words: int) -> list[QARecord]:
    return [QARecord(id=f"q{i}", question=f"Question {i}?", answers=["paris"],
                     context=" ".join(f"w{j}" for j in range(n)))
            for i, n in enumerate(words)]


MEMAGENT = MemAgentConfig(chunk_size=8, max_memory_tokens=6, max_final_tokens=8,
                          temperature=1.0, top_p=1.0, seed=7)


# ---------------------------------------------------------------- seeds and modes


def test_request_params_and_batch_params_by_hand():
    prompts = [[1], [2], [3]]
    each = request_params(prompts, SamplingParams(seed=9, max_new_tokens=4))
    assert [p.seed for p in each] == [derive_seed(9, 0), derive_seed(9, 1), derive_seed(9, 2)]
    assert {p.max_new_tokens for p in each} == {4}
    assert [p.seed for p in request_params(prompts, SamplingParams())] == [None] * 3
    mine = [SamplingParams(seed=s) for s in (5, 6, 7)]
    assert request_params(prompts, mine) == mine  # per-request seeds are taken as they are
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        request_params(prompts, mine[:2])
    # An engine that seeds a whole call (HF): one seed hashed from the requests' seeds.
    assert batch_params(prompts, mine) == SamplingParams(seed=derive_seed("batch", "5", "6", "7"))
    assert batch_params(prompts, [SamplingParams()] * 3) == SamplingParams()
    one = SamplingParams(seed=3)
    assert batch_params(prompts, one) is one
    with pytest.raises(ValueError, match="prompt 1 asks for other sampling settings"):
        batch_params(prompts[:2], [SamplingParams(seed=1), SamplingParams(max_new_tokens=9)])


def test_episode_keys_count_copies_of_a_record():
    assert episode_keys(["a", "b", "a"], 2) == [
        ("a", 0, 0), ("a", 0, 1), ("b", 0, 0), ("b", 0, 1), ("a", 1, 0), ("a", 1, 1)]


def test_rollout_mode_auto_follows_the_engine(tiny_tokenizer):
    scripted = ScriptedGenerator(tiny_tokenizer, lambda p: "x")  # generate only
    engine = ScriptedAsyncEngine(tiny_tokenizer, memagent_reply)
    assert isinstance(engine, Engine) and not isinstance(scripted, Engine)
    assert runs_async(engine, "auto") and not runs_async(scripted, "auto")
    assert not runs_async(engine, "lockstep") and runs_async(engine, "async")
    with pytest.raises(ValueError, match="needs an engine with agenerate"):
        runs_async(scripted, "async")
    with pytest.raises(ValueError, match="rollout mode must be one of"):
        runs_async(engine, "eager")


def test_rollout_mode_is_a_training_option():
    base = ["model.path=m", "data.train_file=t.jsonl"]
    assert load_config(TrainConfig, None, base).rollout.mode == "auto"
    cfg = load_config(TrainConfig, None, [*base, "rollout.mode=lockstep"])
    assert cfg.rollout.mode == "lockstep"
    with pytest.raises(MemrlInputError, match="rollout.mode"):
        load_config(TrainConfig, None, [*base, "rollout.mode=eager"])


# ---------------------------------------------------------------- MemAgent


def test_memagent_async_equals_lockstep(tiny_tokenizer):
    records = records_of_lengths(30, 5, 60, 17)
    records.append(records[1])  # the same question twice in one run (a wrapped stream)
    engine = ScriptedAsyncEngine(tiny_tokenizer, memagent_reply, seed=1)
    agent = MemAgent(engine, MEMAGENT)
    assert len({len(agent.chunk(r).texts) for r in records}) == 4  # 1 to 4+ chunks

    lockstep = agent.run(records, num_samples=3, mode="lockstep")
    assert engine.events == [] and len(engine.generate_calls) == 1 + max(
        t.details.num_chunks for t in lockstep)
    calls = list(engine.generate_calls)
    asynchronous = agent.run(records, num_samples=3, mode="async")
    assert engine.generate_calls == calls  # the async path sent requests one by one
    assert len(engine.prompts) == sum(len(t.turns) for t in lockstep)
    assert_same_trajectories(lockstep, asynchronous)
    # another random completion order: still the same trajectories
    again = MemAgent(ScriptedAsyncEngine(tiny_tokenizer, memagent_reply, seed=2), MEMAGENT)
    assert_same_trajectories(lockstep, again.run(records, num_samples=3, mode="auto"))

    # samples of a group and the copy of a record differ; the answers were scored as text
    finals = [t.details.final_response for t in lockstep]
    assert len(set(finals)) > len(records)
    copy, original = lockstep[-3:], lockstep[3:6]
    assert [t.record_id for t in copy] == [t.record_id for t in original]
    assert [t.turns[0].response_ids for t in copy] != [t.turns[0].response_ids for t in original]


def test_memagent_async_progress_events_add_up(tiny_tokenizer):
    records = records_of_lengths(30, 5, 60)
    events: list[ProgressEvent] = []
    agent = MemAgent(ScriptedAsyncEngine(tiny_tokenizer, memagent_reply), MEMAGENT)
    trajectories = agent.run(records, num_samples=2, progress=events.append, mode="async")
    start = events[0]
    assert start.kind == "start" and start.episodes == 6
    assert start.chunks == sum(t.details.num_chunks for t in trajectories)
    assert sum(e.chunks for e in events if e.kind == "chunks") == start.chunks
    assert sum(e.episodes for e in events if e.kind == "final") == 6


def test_async_episodes_overlap(tiny_tokenizer):
    """No lockstep wait: the fast episode's next turns go out while the slow one's first
    reply is still pending, and several requests are in flight at once."""
    records = [QARecord(id="slow", question="Slow question?", answers=["a"], context="w0 w1"),
               QARecord(id="fast", question="Fast question?", answers=["a"],
                        context=" ".join(f"w{j}" for j in range(30)))]
    engine = ScriptedAsyncEngine(tiny_tokenizer, memagent_reply,
                                 delay=lambda p: 0.05 if "Slow question" in p else 0.001)
    MemAgent(engine, MEMAGENT).run(records, mode="async")
    assert engine.max_in_flight > 1
    slow = [n for n, p in enumerate(engine.prompts) if "Slow question" in p]
    fast = [n for n, p in enumerate(engine.prompts) if "Fast question" in p]
    slow_first_done = engine.events.index(("done", slow[0]))
    fast_second_sent = engine.events.index(("send", fast[1]))
    assert fast_second_sent < slow_first_done
    assert sum(engine.events.index(("send", n)) < slow_first_done for n in fast) >= 3


def test_a_failing_request_cancels_the_other_episodes(tiny_tokenizer):
    class Failing(ScriptedAsyncEngine):
        async def agenerate(self, prompt, params):
            number = len(self.prompts)
            reply = await super().agenerate(prompt, params)
            if number == 5:
                raise RuntimeError("engine lost")
            return reply

    engine = Failing(tiny_tokenizer, memagent_reply)
    with pytest.raises(RuntimeError, match="engine lost"):
        MemAgent(engine, MEMAGENT).run(records_of_lengths(30, 40), num_samples=2, mode="async")
    assert engine.in_flight == 0  # nothing left running


def test_run_concurrently_keeps_order_and_raises_the_first_error():
    done = []

    async def value(x, wait):
        await asyncio.sleep(wait)
        done.append(x)
        return x

    async def fail():
        await asyncio.sleep(0.001)
        raise KeyError("bad")

    assert asyncio.run(run_concurrently([value(1, 0.003), value(2, 0.0), value(3, 0.001)])) \
        == [1, 2, 3]
    assert done == [2, 3, 1]
    done.clear()
    with pytest.raises(KeyError):
        asyncio.run(run_concurrently([value(1, 0.05), fail()]))
    assert done == []  # the slow one was cancelled, not awaited to its end


def test_task_rollout_picks_the_schedule_from_the_engine(tiny_tokenizer):
    task = MemAgentQATask(MEMAGENT, reward="f1")
    records = records_of_lengths(20, 9)
    engine = ScriptedAsyncEngine(tiny_tokenizer, memagent_reply)
    auto = task.rollout(engine, records, num_samples=2, seed=4)
    assert engine.prompts and engine.generate_calls == []  # auto: async on this engine
    lockstep = task.rollout(engine, records, num_samples=2, seed=4, mode="lockstep")
    assert engine.generate_calls  # lockstep: generate calls
    assert_same_trajectories(auto, lockstep)  # answers, rewards and metrics too
    other = task.rollout(engine, records, num_samples=2, seed=5)
    assert [t.turns[0].response_ids for t in other] != [t.turns[0].response_ids for t in auto]


# ---------------------------------------------------------------- MemoryUpdate


def test_memupdate_async_equals_lockstep(tiny_tokenizer):
    store = MemoryStore(HashingEmbedder())
    episodes = [episode("e0", 2), episode("e1", 7), episode("e2", 4)]
    for e in episodes:
        create_base_namespace(store, e)
    cfg = MemUpdateConfig(embedder="hashing", max_turns=3, session_chunk_turns=2,
                          max_response_tokens=40, memory_view_k=3, seed=3)
    engine = ScriptedAsyncEngine(tiny_tokenizer, tool_reply, seed=5)
    agent = MemoryUpdateAgent(engine, store, cfg)
    lockstep = agent.run(episodes, num_samples=2, mode="lockstep")
    asynchronous = agent.run(episodes, num_samples=2, mode="async")
    assert len(engine.prompts) == sum(len(t.turns) for t in lockstep)
    # the trial namespaces are named per run; everything else is equal
    assert_same_trajectories(lockstep, asynchronous, ignore_details=("namespace",))
    turns = [len(t.turns) for t in lockstep]
    assert len(set(turns)) > 1  # episodes of different lengths: lockstep had stragglers
    assert sum(t.details.ops["insert"] for t in lockstep) > 0  # the memory was edited
    for t in lockstep + asynchronous:
        store.release(t.details.namespace)
    assert sorted(store.namespaces()) == ["e0", "e1", "e2"]


def test_memupdate_async_failure_releases_the_trials(tiny_tokenizer):
    store = MemoryStore(HashingEmbedder())
    episodes = [episode("e0", 4), episode("e1", 4)]
    for e in episodes:
        create_base_namespace(store, e)

    class Failing(ScriptedAsyncEngine):
        async def agenerate(self, prompt, params):
            if len(self.prompts) == 3:
                raise RuntimeError("engine lost")
            return await super().agenerate(prompt, params)

    agent = MemoryUpdateAgent(Failing(tiny_tokenizer, tool_reply), store,
                              MemUpdateConfig(embedder="hashing", seed=1))
    with pytest.raises(RuntimeError, match="engine lost"):
        agent.run(episodes, num_samples=2, mode="async")
    assert sorted(store.namespaces()) == ["e0", "e1"]

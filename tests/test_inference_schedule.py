"""The episode driver: lockstep rounds by stage and sampling setting, async equal to it."""

from __future__ import annotations

import asyncio

import pytest

from memrl.inference.base import Generation, SamplingParams
from memrl.inference.schedule import arun_episodes, run_episodes, run_lockstep


class Echo:
    """Replies to prompt [x, ...] with the token x + 1; records every generate call as the
    list of its prompts' first tokens, and every agenerate."""

    tokenizer = None
    continuous_batching = False

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.settings: list[int] = []
        self.single: list[int] = []

    def generate(self, prompts, params):
        self.calls.append([p[0] for p in prompts])
        self.settings.append(params[0].max_new_tokens)
        assert len({p.max_new_tokens for p in params}) == 1  # one setting per call
        return [Generation([p[0] + 1], [0.0], str(p[0] + 1)) for p in prompts]

    async def agenerate(self, prompt, params):
        self.single.append(prompt[0])
        await asyncio.sleep(0.001 * (prompt[0] % 3))  # replies come back out of order
        return Generation([prompt[0] + 1], [0.0], str(prompt[0] + 1))


def counting(start: int, updates: int, final_tokens: int = 8):
    """An episode: `updates` stage-0 calls, each on the last reply, then one stage-1 call
    with its own max_new_tokens; returns every token it got."""

    async def episode(calls):
        got, x = [], start
        for _ in range(updates):
            x = (await calls.generate([x], SamplingParams(max_new_tokens=4))).token_ids[0]
            got.append(x)
        final = await calls.generate([x], SamplingParams(max_new_tokens=final_tokens), stage=1)
        return [*got, final.token_ids[0]]

    return episode


def test_lockstep_rounds_go_by_lowest_stage_in_episode_order():
    engine = Echo()
    results = run_episodes(engine, [counting(10, 2), counting(20, 0), counting(30, 3)],
                           mode="lockstep")
    assert results == [[11, 12, 13], [21], [31, 32, 33, 34]]
    # stage 0 while anyone asks for it (episode 1 waits at stage 1 from the start), then all
    # the finals in one call, in episode order
    assert engine.calls == [[10, 30], [11, 31], [32], [12, 20, 33]]
    assert engine.settings == [4, 4, 4, 8]
    assert engine.single == []


def test_lockstep_sends_one_call_per_sampling_setting():
    engine = Echo()
    results = run_lockstep(engine, [counting(10, 1, final_tokens=8), counting(20, 1, 9),
                                    counting(30, 1, 8)])
    assert results == [[11, 12], [21, 22], [31, 32]]
    assert engine.calls == [[10, 20, 30], [11, 31], [21]]  # setting 8 first: it came first
    assert engine.settings == [4, 8, 9]


def test_async_gives_the_lockstep_results_one_request_at_a_time():
    episodes = [counting(10, 2), counting(20, 0), counting(30, 3)]
    engine = Echo()
    assert run_episodes(engine, episodes, mode="async") == [[11, 12, 13], [21], [31, 32, 33, 34]]
    assert engine.calls == [] and sorted(engine.single) == [10, 11, 12, 20, 30, 31, 32, 33]
    engine.continuous_batching = True  # auto follows the engine
    assert run_episodes(engine, episodes) == [[11, 12, 13], [21], [31, 32, 33, 34]]
    assert engine.calls == []
    assert asyncio.run(arun_episodes(Echo(), episodes[:1])) == [[11, 12, 13]]


def test_an_episode_without_calls_and_no_episodes():
    async def nothing(calls):
        return "done"

    assert run_episodes(Echo(), [nothing, nothing], mode="lockstep") == ["done", "done"]
    assert run_episodes(Echo(), [], mode="lockstep") == []


def test_a_failure_closes_the_other_episodes_and_is_raised():
    closed = []

    def guarded(start):
        async def episode(calls):
            try:
                await calls.generate([start], SamplingParams())
                if start == 2:
                    raise KeyError("bad reply")
                await calls.generate([start], SamplingParams())
            finally:
                closed.append(start)
        return episode

    with pytest.raises(KeyError, match="bad reply"):
        run_lockstep(Echo(), [guarded(1), guarded(2), guarded(3)])
    assert sorted(closed) == [1, 2, 3]  # every episode's cleanup ran


def test_lockstep_refuses_what_it_cannot_drive():
    async def sleeper(calls):
        await asyncio.sleep(0)

    with pytest.raises(TypeError, match="may only await its calls.generate"):
        run_lockstep(Echo(), [sleeper])

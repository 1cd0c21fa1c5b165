"""The memory store served by a Ray actor (memrl[ray]): the same results and errors as the
in-process store, namespace isolation across processes, and the MemoryUpdate agent unchanged
on top of it, in rollout workers of their own."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from test_agent_memupdate import call, last_message, make_episode
from test_memory_store import TwoTrials, check_trials, random_edits

from memrl.agents.memupdate import MemoryUpdateAgent, MemUpdateConfig, create_base_namespace
from memrl.errors import MissingDependencyError
from memrl.memory.embedder import HashingEmbedder
from memrl.memory.store import MemoryBackend, MemoryStore, MemoryStoreError
from memrl.memory.tools import ToolCall, execute_tool_call

pytestmark = pytest.mark.xdist_group("ray")  # one worker starts the session's Ray cluster

NAME = "memrl-test-memory"


@pytest.fixture(scope="module")
def store(ray_cluster):
    from memrl.memory.ray_store import RayMemoryStore

    s = RayMemoryStore.start(HashingEmbedder(dim=64), name=NAME, timeout_s=60)
    try:
        yield s
    finally:
        s.shutdown()


@pytest.fixture
def empty(store):
    for ns in store.namespaces():
        store.release(ns)
    return store


@pytest.mark.slow
def test_same_answers_and_errors_as_the_local_store(empty):
    local = MemoryStore(HashingEmbedder(dim=64))
    assert isinstance(empty, MemoryBackend)
    assert (empty.embedder.name, empty.embedder.dim) == ("hashing-64", 64)
    assert (empty.embedder.embed(["alice oslo"]) == local.embedder.embed(["alice oslo"])).all()
    for s in (local, empty):
        assert s.create_namespace("conv", ["alice oslo", "bob tea"], step=1) == ["m0", "m1"]
        trial = s.fork("conv", "r1")
        assert s.insert(trial, "carol chess", step=2) == "m2"
        s.update(trial, "m0", "alice paris", step=3)
        s.delete(trial, "m1")
    for ns in ("conv", "conv--r1"):
        assert empty.list(ns) == local.list(ns)
        assert empty.stats(ns) == local.stats(ns)
        assert empty.search_many(ns, ["alice", "chess"], 2) == local.search_many(
            ns, ["alice", "chess"], 2)
    assert empty.namespaces() == local.namespaces() == ["conv", "conv--r1"]
    assert empty.exists("conv") and not empty.exists("nope")
    # The store's own errors, not Ray's wrapper: the tool layer shows them to the model.
    with pytest.raises(MemoryStoreError) as got:
        empty.get("conv--r1", "m1")
    assert type(got.value) is MemoryStoreError
    assert str(got.value) == "no memory with id 'm1' in this memory"
    result = execute_tool_call(empty, "conv--r1", ToolCall("memory_delete", {"id": "m1"}))
    assert not result.ok and result.content == execute_tool_call(
        local, "conv--r1", ToolCall("memory_delete", {"id": "m1"})).content
    with pytest.raises(MemoryStoreError, match="already exists"):
        empty.fork("conv", "r1")


@pytest.mark.slow
def test_a_second_client_connects_by_name(empty):
    from memrl.memory.ray_store import RayMemoryStore

    empty.create_namespace("shared", ["one fact"])
    other = RayMemoryStore.connect(NAME)
    assert [r.text for r in other.list("shared")] == ["one fact"]
    with pytest.raises(ValueError, match="no memory store actor named 'nope'"):
        RayMemoryStore.connect("nope")


class SlowEmbedder(HashingEmbedder):
    """Takes 30 s to embed "slow": a stuck actor."""

    def embed(self, texts):
        if "slow" in texts:
            time.sleep(30)
        return super().embed(texts)


@pytest.mark.slow
def test_a_stuck_actor_is_a_timeout_not_a_hang(ray_cluster):
    from memrl.memory.ray_store import RayMemoryStore

    stuck = RayMemoryStore.start(SlowEmbedder(dim=8))
    try:
        stuck.create_namespace("ns")
        stuck.timeout_s = 0.5
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="did not answer insert within 0.5 s"):
            stuck.insert("ns", "slow")
        assert time.monotonic() - t0 < 5
    finally:
        stuck.shutdown()


def test_without_ray_the_error_names_the_extra(monkeypatch):
    import sys

    from memrl.memory.ray_store import RayMemoryStore

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"memrl\[ray\]"):
        RayMemoryStore.start(HashingEmbedder())


class TwoTrialsOnRay(TwoTrials):
    """The isolation property of the in-process store, with the store in the actor."""

    client: MemoryBackend | None = None

    def new_store(self) -> MemoryBackend:
        for ns in self.client.namespaces():
            self.client.release(ns)
        return self.client


@pytest.mark.slow
def test_isolation_property_holds_across_processes(store):
    TwoTrialsOnRay.client = store
    try:
        TwoTrialsOnRay.TestCase.settings = settings(
            max_examples=10, stateful_step_count=20, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
        )
        TwoTrialsOnRay.TestCase().runTest()
    finally:
        TwoTrialsOnRay.client = None


def edit_in_worker(store: MemoryBackend, tag: str, seed: int) -> tuple[int, str, dict]:
    """A Ray task: random edits of its own trial of "base" through the shared actor."""
    ns, mine = random_edits(store, tag, seed, steps=150)
    return os.getpid(), ns, mine


@pytest.mark.slow
def test_two_worker_processes_edit_two_trials_concurrently(empty, ray_cluster):
    ray = ray_cluster
    empty.create_namespace("base", [f"base fact {i}" for i in range(5)])
    base = empty.list("base")
    task = ray.remote(edit_in_worker)
    done = ray.get([task.remote(empty, "left", 1), task.remote(empty, "right", 2)], timeout=120)
    pids = {pid for pid, _, _ in done}
    assert len(pids) == 2 and os.getpid() not in pids  # two processes besides this one
    check_trials(empty, {ns: mine for _, ns, mine in done}, base)


def secrets_reply(prompt: str) -> str:
    """Insert a secret naming this worker, search for secrets, then stop."""
    last = last_message(prompt)
    if last.startswith("user"):
        return call("memory_insert", text=f"secret of pid {os.getpid()}")
    if '"inserted"' in last:
        return call("memory_search", query="secret of pid", top_k=10)
    return "Done."


def agent_in_worker(store: MemoryBackend, model_dir: str, episode) -> list[dict]:
    """A rollout worker: the MemoryUpdate agent, as in-process, on the shared store."""
    from transformers import AutoTokenizer

    from memrl.inference.scripted import ScriptedGenerator

    generator = ScriptedGenerator(AutoTokenizer.from_pretrained(model_dir), secrets_reply)
    agent = MemoryUpdateAgent(generator, store, MemUpdateConfig(embedder="hashing", max_turns=3))
    trajs = agent.run([episode], num_samples=2)
    return [{"pid": os.getpid(), "namespace": t.details.namespace, "ops": t.details.ops,
             "texts": sorted(r.text for r in store.list(t.details.namespace))} for t in trajs]


@pytest.mark.slow
def test_the_agent_runs_unchanged_in_two_rollout_workers(empty, ray_cluster, tiny_model_dir):
    ray = ray_cluster
    episodes = [make_episode(f"ep{i}", ["Hello."], ["Ann likes tea."]) for i in range(2)]
    for e in episodes:
        create_base_namespace(empty, e)
    task = ray.remote(agent_in_worker)
    results = ray.get([task.remote(empty, str(tiny_model_dir), e) for e in episodes],
                      timeout=120)
    trials = [t for per_worker in results for t in per_worker]
    assert len({t["pid"] for t in trials}) == 2 and len({t["namespace"] for t in trials}) == 4
    for t in trials:
        # Its own secret only: not the other worker's, nor its sibling trial's (same pid).
        assert t["texts"] == sorted(["Ann likes tea.", f"secret of pid {t['pid']}"])
        assert t["ops"] == {"insert": 1, "update": 0, "delete": 0, "search": 1}
    for e in episodes:
        assert [r.text for r in empty.list(e.id)] == ["Ann likes tea."]


@pytest.mark.slow
def test_the_agent_isolation_test_passes_on_the_actor(empty, tiny_tokenizer):
    from test_agent_memupdate import test_two_trials_of_one_base_never_see_each_other as iso

    iso(tiny_tokenizer, empty)  # the MemoryUpdate agent's isolation test, store in the actor


@pytest.mark.pipeline
@pytest.mark.slow
def test_two_ray_ranks_train_memoryupdate_on_one_store_actor(ray_cluster, tiny_model_dir,
                                                              tmp_path):
    """`memupdate.store: ray` under `trainer.launcher: ray`: both ranks' base and trial
    namespaces live in one MemoryStoreManager actor, each rank under its own prefix."""
    import dist_train

    from memrl.config import load_config
    from memrl.data.locomo import save_episodes
    from memrl.distributed import train_on_ray
    from memrl.recipes.config import TrainConfig
    from memrl.run.metrics import read_metrics

    data = tmp_path / "data"
    save_episodes([
        make_episode(f"conv-t-qa{i}-0000000{i}", [f"My code is {i}{i}17.", "Noted.", "Bye."],
                     ["Ann likes tea.", "Bob runs."], answers=[f"{i}{i}17"])
        for i in range(4)], data)
    out = tmp_path / "run"
    config = Path(__file__).resolve().parents[1] / "configs" / "memupdate_locomo.yaml"
    cfg = load_config(TrainConfig, config, [
        f"model.path={tiny_model_dir}", f"data.train_file={data}", "data.val_file=null",
        f"trainer.out_dir={out}", "trainer.total_steps=1", "trainer.log_sinks=[jsonl]",
        "trainer.save_freq=0", "data.train_batch_size=2", "rollout.n=2",
        "rl.ppo_mini_batch_size=2", "memupdate.embedder=hashing", "memupdate.store=ray",
        "memupdate.store_actor=memrl-test-shared-store", "memupdate.max_response_tokens=12",
        "memupdate.session_chunk_turns=2", "memupdate.memory_view_k=2",
        "trainer.launcher=ray", "trainer.ray.num_workers=2"])
    namespaces = train_on_ray(cfg, dist_train.train_and_list_store)
    assert {n.split(":")[0] for n in namespaces} == {"rank0", "rank1"}, namespaces
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "train/reward_mean" in r]
    assert len(rows) == 1 and rows[0]["train/samples"] >= 8


def test_prefixed_views_of_one_store_never_meet():
    from memrl.memory.ray_store import PrefixedStore

    shared = MemoryStore(HashingEmbedder(dim=64))
    a, b = PrefixedStore(shared, "rank0:"), PrefixedStore(shared, "rank1:")
    assert a.create_namespace("conv", ["alice oslo"]) == ["m0"]
    assert b.create_namespace("conv", ["bob tea", "carol chess"]) == ["m0", "m1"]
    trial = a.fork("conv", "r1")
    assert trial == "conv--r1" and a.insert(trial, "dave rome") == "m1"
    assert sorted(a.namespaces()) == ["conv", "conv--r1"] and b.namespaces() == ["conv"]
    assert sorted(shared.namespaces()) == ["rank0:conv", "rank0:conv--r1", "rank1:conv"]
    assert [r.text for r in b.list("conv")] == ["bob tea", "carol chess"]
    assert a.search("conv--r1", "dave", 1)[0][0].text == "dave rome"
    assert not b.exists("conv--r1")
    a.release(trial)
    assert a.namespaces() == ["conv"] and a.embedder is shared.embedder

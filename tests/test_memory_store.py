"""MemoryStore: every operation by hand, namespace isolation by property and by threads."""

from __future__ import annotations

import dataclasses
import random
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from memrl.errors import MemrlInputError
from memrl.memory.embedder import HashingEmbedder
from memrl.memory.store import (
    MemoryBackend,
    MemoryRecord,
    MemoryStore,
    MemoryStoreError,
    validate_namespace,
)

SQRT_HALF = float(np.sqrt(0.5))


class CountingEmbedder(HashingEmbedder):
    """HashingEmbedder that records how often, and on what, it was called."""

    def __init__(self, dim: int = 256) -> None:
        super().__init__(dim)
        self.calls: list[list[str]] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        return super().embed(texts)


@pytest.fixture
def emb() -> CountingEmbedder:
    e = CountingEmbedder()
    words = ["alice", "oslo", "bob", "tea", "carol", "chess", "paris"]
    assert len({e.bucket(w) for w in words}) == len(words)  # hand values assume no collision
    return e


@pytest.fixture
def store(emb) -> MemoryStore:
    s = MemoryStore(emb)
    s.create_namespace("conv-1", ["alice oslo", "bob tea", "alice bob"], step=2)
    return s


def texts(store: MemoryStore, ns: str) -> dict[str, str]:
    return {r.id: r.text for r in store.list(ns)}


# ---- create / get / list / stats -------------------------------------------------------------


def test_create_namespace_records_and_stats(store, emb):
    assert isinstance(store, MemoryBackend)
    assert store.namespaces() == ["conv-1"] and store.exists("conv-1")
    assert texts(store, "conv-1") == {"m0": "alice oslo", "m1": "bob tea", "m2": "alice bob"}
    r = store.get("conv-1", "m1")
    assert (r.id, r.text, r.created_step, r.updated_step, r.source) == (
        "m1", "bob tea", 2, 2, "initial"
    )
    assert emb.calls == [["alice oslo", "bob tea", "alice bob"]]  # one batch for the namespace
    np.testing.assert_allclose(r.embedding, emb.embed(["bob tea"])[0])
    assert store.stats("conv-1") == {
        "count": 3, "chars": 10 + 7 + 9, "tokens": 6, "inserts": 0, "updates": 0, "deletes": 0
    }


def test_create_namespace_with_sources_and_empty(emb):
    s = MemoryStore(emb)
    assert s.create_namespace("a", ["x y", "z"], sources=["session_1", "session_2"]) == ["m0", "m1"]
    assert [r.source for r in s.list("a")] == ["session_1", "session_2"]
    assert s.create_namespace("empty") == []
    assert s.list("empty") == [] and s.search("empty", "anything") == []
    assert s.stats("empty")["count"] == 0
    assert s.insert("empty", "first") == "m0"


def test_create_namespace_with_precomputed_embeddings(emb):
    s = MemoryStore(emb)
    vecs = np.zeros((2, 256), dtype=np.float64)
    vecs[0, 0], vecs[1, 1] = 3.0, 0.5  # not unit length: the store normalises
    s.create_namespace("pre", ["alice", "bob"], embeddings=vecs)
    assert emb.calls == []  # nothing re-embedded
    got = s.get("pre", "m0").embedding
    assert got.dtype == np.float32 and got[0] == 1.0 and np.count_nonzero(got) == 1
    assert s.get("pre", "m1").embedding[1] == 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"texts": ["a", "  "]}, "text 1 must not be empty"),
        ({"texts": ["a", 5]}, "text 1 must be a string"),
        ({"texts": "a string"}, "not one string"),
        ({"texts": ["a"], "sources": ["s1", "s2"]}, "2 sources for 1 texts"),
        ({"texts": ["a"], "embeddings": np.zeros((2, 256))}, "shape (2, 256), expected (1, 256)"),
        ({"texts": ["a"], "embeddings": np.zeros((1, 8))}, "expected (1, 256)"),
        ({"texts": ["a"], "embeddings": np.full((1, 256), np.nan)}, "NaN"),
    ],
)
def test_create_namespace_errors(emb, kwargs, message):
    s = MemoryStore(emb)
    with pytest.raises(MemoryStoreError) as info:
        s.create_namespace("n", **kwargs)
    assert message in str(info.value)
    assert not s.exists("n")


def test_create_existing_or_invalid_namespace(store):
    with pytest.raises(MemoryStoreError, match="already exists"):
        store.create_namespace("conv-1", ["x"])
    with pytest.raises(MemrlInputError):
        store.create_namespace("../etc", ["x"])


# ---- insert / update / delete -------------------------------------------------------------


def test_insert(store, emb):
    assert store.insert("conv-1", "carol chess", step=7) == "m3"
    r = store.get("conv-1", "m3")
    assert (r.text, r.created_step, r.updated_step, r.source) == ("carol chess", 7, 7, "agent")
    assert store.insert("conv-1", "paris", source="session_3") == "m4"
    assert store.get("conv-1", "m4").source == "session_3"
    assert store.stats("conv-1")["inserts"] == 2
    for bad, message in [("", "must not be empty"), (" \n", "must not be empty"),
                         (None, "must be a string")]:
        with pytest.raises(MemoryStoreError, match=message):
            store.insert("conv-1", bad)
    assert store.stats("conv-1")["count"] == 5


def test_update_replaces_record(store, emb):
    before = store.get("conv-1", "m1")
    after = store.update("conv-1", "m1", "carol chess", step=9)
    assert (after.id, after.text, after.created_step, after.updated_step, after.source) == (
        "m1", "carol chess", 2, 9, "initial"
    )
    assert store.get("conv-1", "m1") is after
    assert before.text == "bob tea"  # the old record object is untouched
    np.testing.assert_allclose(after.embedding, emb.embed(["carol chess"])[0])
    assert list(texts(store, "conv-1")) == ["m0", "m1", "m2"]  # position kept
    assert store.stats("conv-1")["updates"] == 1
    with pytest.raises(MemoryStoreError, match="no memory with id 'm9'"):
        store.update("conv-1", "m9", "x")
    with pytest.raises(MemoryStoreError, match="must not be empty"):
        store.update("conv-1", "m1", "")
    assert store.stats("conv-1")["updates"] == 1


def test_delete_and_ids_never_reused(store):
    removed = store.delete("conv-1", "m2")
    assert removed.text == "alice bob"
    assert texts(store, "conv-1") == {"m0": "alice oslo", "m1": "bob tea"}
    with pytest.raises(MemoryStoreError, match="no memory with id 'm2'"):
        store.get("conv-1", "m2")
    with pytest.raises(MemoryStoreError, match="no memory with id 'm2'"):
        store.delete("conv-1", "m2")
    assert store.insert("conv-1", "paris") == "m3"
    assert store.stats("conv-1") == {
        "count": 3, "chars": 10 + 7 + 5, "tokens": 5, "inserts": 1, "updates": 0, "deletes": 1
    }


def test_records_are_immutable(store):
    r = store.get("conv-1", "m0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.text = "changed"  # type: ignore[misc]
    with pytest.raises(ValueError):
        r.embedding[0] = 5.0


def test_record_equality_compares_embeddings():
    v = np.ones(3, dtype=np.float32)
    a = MemoryRecord("m0", "t", v, 0, 0, "s")
    assert a == MemoryRecord("m0", "t", v.copy(), 0, 0, "s")
    assert a != MemoryRecord("m0", "t", v * 2, 0, 0, "s")
    assert a != MemoryRecord("m0", "t", v, 0, 1, "s")
    assert "embedding" not in repr(a)


# ---- search --------------------------------------------------------------------------------


def test_search_hand_scores_and_tie_order(store):
    hits = store.search("conv-1", "Alice?", top_k=5)
    assert [(r.id, round(s, 6)) for r, s in hits] == [
        ("m0", round(SQRT_HALF, 6)), ("m2", round(SQRT_HALF, 6)), ("m1", 0.0)
    ]
    hits = store.search("conv-1", "bob tea", top_k=2)
    assert [r.id for r, _ in hits] == ["m1", "m2"]
    assert hits[0][1] == pytest.approx(1.0) and hits[1][1] == pytest.approx(0.5)
    assert len(store.search("conv-1", "alice", top_k=1)) == 1


def test_search_ties_in_numeric_id_order(emb):
    s = MemoryStore(emb)
    s.create_namespace("n", ["same words"] * 12)
    assert [r.id for r, _ in s.search("n", "same", top_k=12)][:4] == ["m0", "m1", "m2", "m3"]
    assert [r.id for r, _ in s.search("n", "same", top_k=12)][-2:] == ["m10", "m11"]
    assert [r.id for r, _ in s.search("n", "same", top_k=3)] == ["m0", "m1", "m2"]
    s.update("n", "m1", "different text")
    assert [r.id for r, _ in s.search("n", "same", top_k=3)] == ["m0", "m2", "m3"]


def test_search_errors(store):
    for bad_k in (0, -1, True, 2.0, "3"):
        with pytest.raises(MemoryStoreError, match="top_k"):
            store.search("conv-1", "alice", top_k=bad_k)
    with pytest.raises(MemoryStoreError, match="query 0 must not be empty"):
        store.search("conv-1", "  ")
    with pytest.raises(MemoryStoreError, match="not one string"):
        store.search_many("conv-1", "alice")


def test_search_many_batches_one_embedding_call(store, emb):
    emb.calls.clear()
    many = store.search_many("conv-1", ["alice", "bob tea", "paris"], top_k=2)
    assert emb.calls == [["alice", "bob tea", "paris"]]
    assert [[r.id for r, _ in hits] for hits in many] == [["m0", "m2"], ["m1", "m2"], ["m0", "m1"]]
    for q, hits in zip(["alice", "bob tea", "paris"], many, strict=True):
        assert [(r.id, s) for r, s in store.search("conv-1", q, 2)] == [
            (r.id, s) for r, s in hits
        ]
    assert store.search_many("conv-1", [], 3) == []


def test_unknown_namespace_everywhere(store):
    calls = [
        lambda: store.insert("nope", "x"),
        lambda: store.update("nope", "m0", "x"),
        lambda: store.delete("nope", "m0"),
        lambda: store.get("nope", "m0"),
        lambda: store.search("nope", "x"),
        lambda: store.search_many("nope", ["x"]),
        lambda: store.list("nope"),
        lambda: store.stats("nope"),
        lambda: store.release("nope"),
        lambda: store.fork("nope", "r1"),
    ]
    for call in calls:
        with pytest.raises(MemoryStoreError, match="unknown namespace 'nope'"):
            call()
    store.release("nope", missing_ok=True)


def test_embedder_with_wrong_output_shape_is_a_bug_not_a_store_error():
    class Broken(HashingEmbedder):
        def embed(self, texts):
            return np.zeros((1, 4), dtype=np.float32)

    with pytest.raises(RuntimeError, match="returned shape"):
        MemoryStore(Broken(dim=8)).create_namespace("n", ["a", "b"])


# ---- fork / release / isolation --------------------------------------------------------------


def test_fork_copies_and_isolates(store, emb):
    emb.calls.clear()
    a = store.fork("conv-1", "req-7")
    b = store.fork("conv-1", "req-8")
    assert emb.calls == []  # a fork re-embeds nothing
    assert (a, b) == ("conv-1--req-7", "conv-1--req-8")
    assert store.namespaces() == ["conv-1", a, b]
    base = store.list("conv-1")
    assert store.list(a) == base
    assert store.get(a, "m0") is store.get("conv-1", "m0")  # shared, immutable record
    # New ids continue the base's counter and are the same in both trials.
    assert store.insert(a, "carol chess") == "m3"
    assert store.insert(b, "paris") == "m3"
    store.update(a, "m0", "bob")
    store.delete(b, "m1")
    assert texts(store, a) == {"m0": "bob", "m1": "bob tea", "m2": "alice bob", "m3": "carol chess"}
    assert texts(store, b) == {"m0": "alice oslo", "m2": "alice bob", "m3": "paris"}
    assert store.list("conv-1") == base
    assert [r.id for r, _ in store.search(b, "chess", top_k=4)] == ["m0", "m2", "m3"]
    assert store.search(a, "chess", top_k=1)[0][0].text == "carol chess"
    assert store.stats(a) == {
        "count": 4, "chars": 3 + 7 + 9 + 11, "tokens": 7, "inserts": 1, "updates": 1, "deletes": 0
    }
    assert store.stats(b)["deletes"] == 1 and store.stats("conv-1")["inserts"] == 0
    # Base edits after the fork do not reach the trials either.
    store.delete("conv-1", "m2")
    assert "m2" in texts(store, a) and "m2" in texts(store, b)
    # Ids are looked up in the given namespace only.
    store.delete(b, "m3")
    with pytest.raises(MemoryStoreError):
        store.get(b, "m3")
    assert store.get(a, "m3").text == "carol chess"


def test_fork_errors_and_release(store):
    t = store.fork("conv-1", "r1")
    with pytest.raises(MemoryStoreError, match="already exists"):
        store.fork("conv-1", "r1")
    for bad in ("a/b", "..", "x y", ""):
        with pytest.raises(MemrlInputError):
            store.fork("conv-1", bad)
    with pytest.raises(MemrlInputError):
        store.fork("conv-1", "r" * 200)
    store.release(t)
    assert not store.exists(t) and store.namespaces() == ["conv-1"]
    with pytest.raises(MemoryStoreError):
        store.release(t)
    t2 = store.fork("conv-1", "r2")
    store.release("conv-1")  # a fork outlives its base
    assert texts(store, t2) == {"m0": "alice oslo", "m1": "bob tea", "m2": "alice bob"}
    assert store.fork(t2, "x") == "conv-1--r2--x"


def test_fork_matrix_cache_is_not_shared_after_edit(store):
    store.search("conv-1", "alice")  # build the base's cache before forking
    t = store.fork("conv-1", "r")
    store.insert(t, "paris")
    assert [r.id for r, _ in store.search(t, "paris", 1)] == ["m3"]
    assert [r.id for r, _ in store.search("conv-1", "paris", 5)] == ["m0", "m1", "m2"]


class TwoTrials(RuleBasedStateMachine):
    """Random edits on two trials of one base: each matches its own model, base never moves."""

    def new_store(self) -> MemoryBackend:
        """An empty store for one example (the Ray variant serves it from an actor)."""
        return MemoryStore(HashingEmbedder(dim=32))

    @initialize()
    def setup(self):
        self.store = self.new_store()
        self.store.create_namespace("base", ["red apple", "green pear", "blue plum"])
        self.base = self.store.list("base")
        self.trials = {
            "A": self.store.fork("base", "A"),
            "B": self.store.fork("base", "B"),
        }
        start = {r.id: r.text for r in self.base}
        self.model = {"A": dict(start), "B": dict(start)}
        self.next = {"A": 3, "B": 3}
        self.counter = 0

    def _text(self, t: str, word: str) -> str:
        self.counter += 1
        return f"trial{t} note{self.counter} {word}"

    @rule(t=st.sampled_from("AB"), word=st.sampled_from(["apple", "pear", "fig", "plum"]))
    def insert(self, t, word):
        text = self._text(t, word)
        rid = self.store.insert(self.trials[t], text)
        assert rid == f"m{self.next[t]}"
        self.next[t] += 1
        self.model[t][rid] = text

    @precondition(lambda self: self.model["A"] or self.model["B"])
    @rule(t=st.sampled_from("AB"), data=st.data())
    def update(self, t, data):
        if not self.model[t]:
            return
        rid = data.draw(st.sampled_from(sorted(self.model[t])))
        text = self._text(t, "updated")
        self.store.update(self.trials[t], rid, text)
        self.model[t][rid] = text

    @rule(t=st.sampled_from("AB"), data=st.data())
    def delete(self, t, data):
        if not self.model[t]:
            return
        rid = data.draw(st.sampled_from(sorted(self.model[t])))
        self.store.delete(self.trials[t], rid)
        del self.model[t][rid]

    @rule(t=st.sampled_from("AB"), data=st.data())
    def touch_id_only_the_other_has(self, t, data):
        other = "B" if t == "A" else "A"
        only_other = sorted(set(self.model[other]) - set(self.model[t]))
        if not only_other:
            return
        rid = data.draw(st.sampled_from(only_other))
        for op in (
            lambda: self.store.get(self.trials[t], rid),
            lambda: self.store.update(self.trials[t], rid, "hijack"),
            lambda: self.store.delete(self.trials[t], rid),
        ):
            with pytest.raises(MemoryStoreError):
                op()

    @rule(t=st.sampled_from("AB"), query=st.sampled_from(["apple", "note1", "trialA", "pear"]))
    def search(self, t, query):
        hits = self.store.search(self.trials[t], query, top_k=50)
        assert {r.id: r.text for r, _ in hits} == self.model[t]

    @invariant()
    def trials_match_models_and_base_is_untouched(self):
        if not hasattr(self, "store"):
            return
        for t, ns in self.trials.items():
            got = {r.id: r.text for r in self.store.list(ns)}
            assert got == self.model[t]
            other = "B" if t == "A" else "A"
            assert not any(text.startswith(f"trial{other} ") for text in got.values())
        assert self.store.list("base") == self.base


TestTwoTrials = TwoTrials.TestCase
TestTwoTrials.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def random_edits(store: MemoryBackend, tag: str, seed: int, *, steps: int = 300,
                 start=None) -> tuple[str, dict[str, str]]:
    """Fork "base" as trial `tag` and make `steps` random edits and searches on it, checking
    every search against a model of the trial; returns (trial, its expected id -> text)."""
    rng = random.Random(seed)
    ns = store.fork("base", tag)
    mine = {r.id: r.text for r in store.list(ns)}
    if start is not None:
        start()
    for i in range(steps):
        op = rng.random()
        if op < 0.5 or not mine:
            text = f"{tag} item {i}"
            mine[store.insert(ns, text)] = text
        elif op < 0.7:
            rid = rng.choice(sorted(mine))
            mine[rid] = f"{tag} edit {i}"
            store.update(ns, rid, mine[rid])
        elif op < 0.85:
            rid = rng.choice(sorted(mine))
            store.delete(ns, rid)
            del mine[rid]
        else:
            hits = store.search(ns, f"{tag} item", top_k=10)
            assert all(r.id in mine and r.text == mine[r.id] for r, _ in hits)
    return ns, mine


def check_trials(store: MemoryBackend, expected: dict[str, dict[str, str]], base) -> None:
    """Each trial holds exactly its own edits (none of the other's), and the base is as it was."""
    assert set(expected) == {"base--left", "base--right"}
    for ns, mine in expected.items():
        got = {r.id: r.text for r in store.list(ns)}
        assert got == mine
        other = "right" if ns.endswith("left") else "left"
        assert not any(t.startswith(other) for t in got.values())
    assert store.list("base") == base


def test_two_threads_edit_two_trials_concurrently():
    store = MemoryStore(HashingEmbedder(dim=64))
    base_texts = [f"base fact {i}" for i in range(5)]
    store.create_namespace("base", base_texts)
    base = store.list("base")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    expected: dict[str, dict[str, str]] = {}

    def worker(tag: str, seed: int) -> None:
        try:
            ns, mine = random_edits(store, tag, seed, start=barrier.wait)
            expected[ns] = mine
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(tag, seed))
               for tag, seed in (("left", 1), ("right", 2))]
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so their operations interleave
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
    finally:
        sys.setswitchinterval(old_interval)
    assert not errors, errors
    check_trials(store, expected, base)


# ---- namespace validation ------------------------------------------------------------------

_VALID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}", fullmatch=True).filter(
    lambda s: ".." not in s
)
_ALLOWED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


@given(_VALID)
def test_valid_namespaces_accepted(name):
    assert validate_namespace(name) == name


@given(_VALID, st.characters().filter(lambda c: c not in _ALLOWED), st.data())
def test_namespace_with_any_foreign_character_rejected(name, bad, data):
    i = data.draw(st.integers(0, len(name)))
    with pytest.raises(MemrlInputError):
        validate_namespace(name[:i] + bad + name[i:])


@pytest.mark.parametrize(
    "name",
    [
        "", "../x", "..", "a..b", "a/b", "a\\b", "/abs", "a b", "a\tb", "a\nb", "a\n",
        "-lead", ".hidden", "_x", ":x", "x" * 201,
        "\uff41bc",  # fullwidth a
        "a\u200bb",  # zero-width space
        "a\u202eb",  # right-to-left override
        "\u0430bc",  # Cyrillic a
        "caf\u00e9", "a\x00b", "\u0661\u0662",  # Arabic-Indic digits
        None, 5, b"bytes",
    ],
)
def test_bad_namespaces_rejected(name):
    with pytest.raises(MemrlInputError):
        validate_namespace(name)


def test_namespace_boundaries():
    assert validate_namespace("x" * 200) == "x" * 200
    assert validate_namespace("conv-26:session.3_a--req-1") == "conv-26:session.3_a--req-1"
    assert validate_namespace("0") == "0"

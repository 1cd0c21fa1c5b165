"""Issue 9 (inputs), unit level: YAML loader, secret scrubbing, namespace names, LoCoMo NaN
answers, tiny-model vocabulary size, atomic text writes."""

from __future__ import annotations

import json
import math
import os
import stat
import time

import pytest

from memrl.config import DuplicateKeyError, load_yaml, parse_override, yaml_load_strict
from memrl.data.locomo import build_locomo_episodes, load_locomo
from memrl.errors import MemrlInputError
from memrl.fileio import write_atomic, write_text_atomic
from memrl.memory.embedder import HashingEmbedder
from memrl.memory.store import MemoryStore, validate_namespace
from memrl.models.tiny import MIN_VOCAB_SIZE, build_tiny_tokenizer, check_vocab_size
from memrl.run.metrics import (
    REDACTED,
    _read_run_id,
    env_secret_values,
    is_secret_key,
    scrub_env_secrets,
    scrub_secrets,
)

# ----------------------------------------------------------------------------- YAML


def _yaml(tmp_path, text: str | bytes, name: str = "c.yaml"):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


def test_duplicate_top_level_key_names_key_and_both_lines(tmp_path):
    p = _yaml(tmp_path, "optim:\n  lr: 0.1\nseed: 1\noptim:\n  weight_decay: 0.0\n")
    with pytest.raises(MemrlInputError) as info:
        load_yaml(p)
    err = info.value
    assert err.location == f"{p}:4"
    assert "duplicate key 'optim'" in err.message
    assert "line 1" in err.message and "line 4" in err.message


def test_duplicate_nested_key_names_key_and_both_lines(tmp_path):
    p = _yaml(tmp_path, "a: 1\nrl:\n  kl_coef: 0.1\n  rollout_n: 4\n  kl_coef: 0.2\n")
    with pytest.raises(MemrlInputError) as info:
        load_yaml(p)
    assert info.value.location == f"{p}:5"
    assert "duplicate key 'kl_coef'" in info.value.message
    assert "line 3" in info.value.message and "line 5" in info.value.message


def test_duplicate_key_in_flow_mapping_and_equal_scalars():
    with pytest.raises(DuplicateKeyError, match="duplicate key 'a'"):
        yaml_load_strict("x: {a: 1, b: 2, a: 3}\n")
    # keys are compared as constructed values: 1 and 0x1 are the same key
    with pytest.raises(DuplicateKeyError, match="duplicate key 1"):
        yaml_load_strict("1: a\n0x1: b\n")


def test_merge_keys_and_equal_keys_in_different_mappings_are_fine(tmp_path):
    p = _yaml(tmp_path, "base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 5\ne:\n  x: 1\n")
    assert load_yaml(p) == {"base": {"x": 1, "y": 2}, "d": {"x": 5, "y": 2}, "e": {"x": 1}}


def test_duplicate_check_is_linear():
    """20k distinct keys load in well under a second (a quadratic check would not)."""
    text = "".join(f"k{i}: {i}\n" for i in range(20_000))
    start = time.perf_counter()
    assert len(yaml_load_strict(text)) == 20_000
    assert time.perf_counter() - start < 5


def test_duplicate_key_in_override_value_is_an_error():
    with pytest.raises(MemrlInputError, match="duplicate key 'a'"):
        parse_override("x={a: 1, a: 2}")
    assert parse_override("x={a: 1, b: 2}") == (["x"], {"a": 1, "b": 2})


@pytest.mark.parametrize(
    ("content", "line", "needle"),
    [
        (b"seed: 1\nname: caf\xe9\n", 2, "not valid UTF-8"),  # latin-1
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", None, "binary file"),  # a PNG
        (b"a: 1\nb: 2\n\x00\x01\x02", None, "binary file"),
        (b"a: 1\nb: \x07\n", 2, "control characters"),
    ],
)
def test_binary_or_non_utf8_yaml_names_file_and_line(tmp_path, content, line, needle):
    p = _yaml(tmp_path, content)
    with pytest.raises(MemrlInputError) as info:
        load_yaml(p)
    assert info.value.location == (f"{p}:{line}" if line else str(p))
    assert needle in info.value.message
    assert "\n" not in str(info.value)


def test_utf8_bom_is_accepted(tmp_path):
    assert load_yaml(_yaml(tmp_path, "\ufeffseed: 1\n")) == {"seed": 1}


def test_unreadable_yaml_is_one_line(tmp_path, monkeypatch):
    p = _yaml(tmp_path, "seed: 1\n")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(p), "read_bytes", denied)
    with pytest.raises(MemrlInputError) as info:
        load_yaml(p)
    assert info.value.location == str(p)
    assert info.value.message == "cannot read config file: Permission denied"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_yaml_by_permissions(tmp_path):
    p = _yaml(tmp_path, "seed: 1\n")
    p.chmod(0)
    with pytest.raises(MemrlInputError, match="Permission denied"):
        load_yaml(p)


def test_directory_as_config(tmp_path):
    with pytest.raises(MemrlInputError, match="not a file"):
        load_yaml(tmp_path)


# ----------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    "name",
    ["GITHUB_PAT", "github_pat", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_CREDENTIALS",
     "db_credential", "NPM_AUTH", "registryAuth", "pat"],
)
def test_new_secret_suffixes(name):
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    ["path", "pat_size", "patience", "author", "auth_enabled", "oauth_scopes",
     "credentials_file_format", "SSH_AUTH_SOCK", "PATH"],
)
def test_suffix_words_elsewhere_are_not_secret(name):
    assert not is_secret_key(name)


def test_short_env_secret_is_scrubbed_as_whole_value_and_token():
    env = {"GH_PAT": "ab", "DEBUG_TOKEN": "1", "HOME": "/root"}
    assert env_secret_values(env) == ["ab", "1"]
    config = {"user": "ab", "note": "token ab here", "word": "cabbage", "n": 1, "n2": 12,
              "flag": True, "items": ["ab", "abc", "v1", "x_1", "id 1"]}
    assert scrub_secrets(config, env) == {
        "user": REDACTED, "note": f"token {REDACTED} here", "word": "cabbage", "n": REDACTED,
        "n2": 12, "flag": True, "items": [REDACTED, "abc", "v1", "x_1", f"id {REDACTED}"],
    }


def test_short_env_secret_false_positives_are_limited():
    env = {"X_AUTH": "a"}
    assert scrub_env_secrets("banana and a cat", env) == f"banana and {REDACTED} cat"
    assert scrub_env_secrets("step 12: loss=0.5", {"Y_TOKEN": "1"}) == "step 12: loss=0.5"
    assert scrub_env_secrets("  a \n", env) == REDACTED  # a whole value, blanks aside


def test_long_env_secret_is_scrubbed_inside_words():
    secret = "ghp_0123456789abcdef"
    env = {"GITHUB_PAT": secret}
    assert scrub_env_secrets(f"url=https://x/?t={secret}&y xx{secret}yy", env) == (
        f"url=https://x/?t={REDACTED}&y xx{REDACTED}yy"
    )


def test_blank_secret_values_are_ignored():
    assert env_secret_values({"A_TOKEN": "", "B_KEY": "   "}) == []
    assert scrub_env_secrets("a b", {"A_TOKEN": ""}) == "a b"


def test_overlapping_secrets_longest_first():
    env = {"A_TOKEN": "abcdefghij", "B_TOKEN": "abcdefghijKLMN"}
    assert scrub_env_secrets("x abcdefghijKLMN y", env) == f"x {REDACTED} y"


# ----------------------------------------------------------------------------- namespaces


@pytest.mark.parametrize(
    "name",
    ["CON", "con", "Prn", "aux", "NUL", "nul.txt", "NUL.tar.gz", "COM1", "com9", "LPT1",
     "lpt9.log", "COM0", "con:x"],
)
def test_windows_reserved_namespaces_are_rejected(name):
    with pytest.raises(MemrlInputError, match="reserved device name on Windows"):
        validate_namespace(name)
    store = MemoryStore(HashingEmbedder(dim=8))
    with pytest.raises(MemrlInputError):
        store.create_namespace(name)
    assert store.namespaces() == []


@pytest.mark.parametrize(
    "name", ["CONV", "conv-26-qa3-1a2b3c4d", "console", "COM10", "LPT", "nul_x", "a.nul",
             "com1x", "auxiliary.txt"],
)
def test_names_near_reserved_ones_are_fine(name):
    assert validate_namespace(name) == name


# ----------------------------------------------------------------------------- LoCoMo


def _locomo(answer) -> list[dict]:
    return [{
        "sample_id": "conv-7",
        "conversation": {
            "session_1_date_time": "1 pm on 1 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I moved to Paris."}],
        },
        "observation": {"session_1_observation": {"Ann": [["Ann moved.", "D1:1"]]}},
        "qa": [
            {"question": "Where?", "answer": "Paris", "evidence": ["D1:1"], "category": 4},
            {"question": "How many?", "answer": answer, "evidence": ["D1:1"], "category": 1},
        ],
    }]


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_locomo_nan_answer_in_json_names_file_conversation_question(tmp_path, text):
    src = tmp_path / "locomo10.json"
    src.write_text(json.dumps(_locomo(0)).replace('"answer": 0', f'"answer": {text}'))
    with pytest.raises(MemrlInputError) as info:
        load_locomo(src)
    assert info.value.location == f"{src}: [0].qa[1].answer"
    assert "finite" in info.value.message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_locomo_nan_answer_in_python_data(value):
    with pytest.raises(MemrlInputError, match=r"x\.json: \[0\]\.qa\[1\]\.answer"):
        build_locomo_episodes(_locomo(value), source_path="x.json")


def test_locomo_finite_number_answers_still_become_strings():
    episodes, _ = build_locomo_episodes(_locomo(2.5), source_path="x.json")
    assert episodes[1].answers == ["2.5"]


# ----------------------------------------------------------------------------- tiny model


def test_vocab_size_below_byte_alphabet_is_an_error():
    assert MIN_VOCAB_SIZE == 256 + 3
    check_vocab_size(MIN_VOCAB_SIZE)
    for bad in (0, 1, 255, MIN_VOCAB_SIZE - 1):
        with pytest.raises(MemrlInputError, match=f"at least {MIN_VOCAB_SIZE}"):
            check_vocab_size(bad)
    with pytest.raises(MemrlInputError):
        build_tiny_tokenizer(vocab_size=100)
    assert len(build_tiny_tokenizer(vocab_size=MIN_VOCAB_SIZE)) == MIN_VOCAB_SIZE


# ----------------------------------------------------------------------------- files


def test_write_text_atomic_is_a_drop_in_for_write_text(tmp_path):
    p = tmp_path / "sub" / "results.md"
    write_text_atomic(p, "# Résumé\n")
    assert p.read_text(encoding="utf-8") == "# Résumé\n"
    write_text_atomic(p, "x", encoding="latin-1")
    assert p.read_bytes() == b"x"
    with pytest.raises(TypeError):
        write_text_atomic(p, b"bytes")  # type: ignore[arg-type]
    assert [f.name for f in p.parent.iterdir()] == ["results.md"]  # no temp file left


def test_write_atomic_keeps_mode_and_writes_through_symlinks(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text("a: 1\n")
    p.chmod(0o600)
    write_atomic(p, "a: 2\n")
    assert stat.S_IMODE(p.stat().st_mode) == 0o600 and p.read_text() == "a: 2\n"
    link = tmp_path / "link.yaml"
    link.symlink_to(p)
    write_atomic(link, "a: 3\n")
    assert link.is_symlink() and p.read_text() == "a: 3\n"


def test_unencodable_text_leaves_no_temp_file(tmp_path):
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(tmp_path / "x.txt", "bad \udcff")
    assert list(tmp_path.iterdir()) == []


def test_wandb_run_id_file(tmp_path):
    f = tmp_path / "wandb_run_id"
    assert _read_run_id(f) is None
    f.write_text("abc123\n")
    assert _read_run_id(f) == "abc123"
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(MemrlInputError, match="wandb_run_id"):
        _read_run_id(f)
    f.write_text("a/b\n")
    with pytest.raises(MemrlInputError, match="not a W&B run id"):
        _read_run_id(f)

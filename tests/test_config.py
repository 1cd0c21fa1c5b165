from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memrl.config import (
    StrictModel,
    apply_overrides,
    config_to_yaml,
    load_config,
    parse_override,
)
from memrl.errors import MemrlInputError


class Inner(StrictModel):
    chunk_size: int = 5000
    name: str = "x"


class Outer(StrictModel):
    seed: int = 0
    inner: Inner = Inner()
    ratios: list[float] = [0.2]


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("seed: 3\ninner:\n  chunk_size: 100\n")
    cfg = load_config(Outer, p, ["inner.name=abc", "ratios=[0.1, 0.3]"])
    assert cfg.seed == 3 and cfg.inner.chunk_size == 100 and cfg.inner.name == "abc"
    assert cfg.ratios == [0.1, 0.3]


def test_unknown_key_is_error_with_dotted_path(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("inner:\n  chunk_sise: 1\n")
    with pytest.raises(MemrlInputError, match=r"inner\.chunk_sise: unknown key"):
        load_config(Outer, p)
    with pytest.raises(MemrlInputError, match=r"inner\.bogus: unknown key"):
        load_config(Outer, None, ["inner.bogus=1"])


def test_wrong_type_names_key():
    with pytest.raises(MemrlInputError, match=r"inner\.chunk_size"):
        load_config(Outer, None, ["inner.chunk_size=abc"])


def test_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("seed: 1\ninner: [unclosed\n")
    with pytest.raises(MemrlInputError, match=r"bad\.yaml:\d+"):
        load_config(Outer, p)


def test_non_mapping_and_missing_file(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(MemrlInputError, match="mapping"):
        load_config(Outer, p)
    with pytest.raises(MemrlInputError, match="not found"):
        load_config(Outer, tmp_path / "nope.yaml")


def test_override_into_value_is_error():
    with pytest.raises(MemrlInputError, match="is a value"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


@pytest.mark.parametrize("bad", ["noequals", "=3", "a..b=1"])
def test_malformed_override(bad):
    with pytest.raises(MemrlInputError):
        parse_override(bad)


def test_round_trip(tmp_path):
    cfg = load_config(Outer, None, ["seed=7", "inner.chunk_size=12"])
    p = tmp_path / "out.yaml"
    p.write_text(config_to_yaml(cfg))
    assert load_config(Outer, p) == cfg


@given(st.text())
def test_parse_override_never_crashes(text):
    try:
        parts, _ = parse_override(text)
        assert all(parts)
    except MemrlInputError:
        pass


@pytest.mark.parametrize("key", ["memagent.temperature=0.3", "memagent.top_p=0.5"])
def test_training_refuses_the_agents_own_sampling_naming_the_rollouts_key(key):
    """The agent's section's sampling is what `memrl eval` and `memrl ask` use; in training
    it would be ignored, so it is an error naming `rollout`'s key."""
    from memrl.recipes.config import TrainConfig

    name = key.split("=")[0].split(".")[1]
    with pytest.raises(MemrlInputError, match=rf"memagent\.{name}: training samples with "
                       rf"rollout\.{name}: set that instead"):
        load_config(TrainConfig, None, ["model.path=m", "data.train_file=d", key])


def test_old_key_names_are_unknown_keys():
    from memrl.recipes.config import TrainConfig

    with pytest.raises(MemrlInputError, match=r"rl\.rollout_n: unknown key"):
        load_config(TrainConfig, None, ["model.path=m", "data.train_file=d", "rl.rollout_n=4"])


def test_split_config_args_config_first_then_overrides():
    from memrl.config import split_config_args

    assert split_config_args(None) == (None, [])
    assert split_config_args(["a.b=1", "c=x"]) == (None, ["a.b=1", "c=x"])
    cfg, overrides = split_config_args(["run.yaml", "a.b=1"])
    assert str(cfg) == "run.yaml" and overrides == ["a.b=1"]
    with pytest.raises(MemrlInputError, match="'other.yaml' is not of the form key.path=value"):
        split_config_args(["run.yaml", "other.yaml"])


def test_load_command_config_base_under_file_under_overrides(tmp_path):
    from pydantic import Field

    from memrl.config import StrictModel, load_command_config

    class Inner(StrictModel):
        x: int = 1
        y: int = 2

    class Cmd(StrictModel):
        inner: Inner = Inner()
        name: str = Field("a")

    assert load_command_config(Cmd, ["inner.x=5"]).inner.x == 5
    assert load_command_config(Cmd, [], base={"name": "b"}).name == "b"
    f = tmp_path / "c.yaml"
    f.write_text("inner: {y: 7}\n")
    got = load_command_config(Cmd, [str(f), "name=z"], base={"inner": {"x": 3}, "name": "b"})
    assert (got.inner.x, got.inner.y, got.name) == (3, 7, "z")
    with pytest.raises(MemrlInputError, match="inner.z: unknown key"):
        load_command_config(Cmd, ["inner.z=1"])

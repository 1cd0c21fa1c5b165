"""Renamed names, config keys and CLI options still work for one release, with one warning."""

from __future__ import annotations

import importlib
import re

import pytest

ENGINE_RENAMES = [
    ("memrl.inference", "HFGenerator", "HFEngine"),
    ("memrl.inference", "VLLMGenerator", "VLLMEngine"),
    ("memrl.inference", "OpenAIGenerator", "OpenAIEngine"),
    ("memrl.inference.hf", "HFGenerator", "HFEngine"),
    ("memrl.inference.vllm", "VLLMGenerator", "VLLMEngine"),
    ("memrl.inference.openai", "OpenAIGenerator", "OpenAIEngine"),
]


@pytest.mark.parametrize(("module", "old", "new"), ENGINE_RENAMES)
def test_old_engine_names_are_the_new_classes_with_a_deprecation_warning(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning) as caught:
        cls = getattr(mod, old)
    assert cls is getattr(mod, new)
    assert [str(w.message) for w in caught] == [
        f"{module}.{old} is deprecated: use {module}.{new} "
        "(the old name goes in the next release)"
    ]


def test_unknown_names_are_still_attribute_errors():
    mod = importlib.import_module("memrl.inference")
    with pytest.raises(AttributeError, match="NoSuchGenerator"):
        mod.NoSuchGenerator  # noqa: B018


@pytest.mark.parametrize("module", ["memrl.rl", "memrl.rl.batch"])
def test_sample_is_the_old_name_of_conversation(module):
    from memrl.rl.batch import Conversation

    with pytest.warns(DeprecationWarning, match=f"{module}.Sample is deprecated"):
        old = getattr(importlib.import_module(module), "Sample")
    assert old is Conversation


def test_rollout_batch_samples_is_the_old_name_of_conversations():
    import torch

    from memrl.rl.batch import Conversation, RolloutBatch

    turn = Conversation([1, 2], [3], [-0.5], 0, "q", 0, "final")
    batch = RolloutBatch((turn,), ("q",), torch.zeros(1), torch.ones(1, dtype=torch.long))
    with pytest.warns(DeprecationWarning, match="RolloutBatch.samples is deprecated: use "
                      "RolloutBatch.conversations"):
        assert batch.samples == batch.conversations == (turn,)


# ---- config keys: the sampling of rollouts moved to `rollout` (issue 23)
OLD_TO_NEW = [
    ("rl.rollout_n=3", "rollout.n", 3),
    ("rl.val_n=2", "rollout.val.n", 2),
    ("rl.val_temperature=0.5", "rollout.val.temperature", 0.5),
    ("rl.val_top_p=0.7", "rollout.val.top_p", 0.7),
    ("rl.generation_batch_size=5", "rollout.generation_batch_size", 5),
    ("memagent.temperature=1.0", "rollout.temperature", 1.0),
    ("memagent.top_p=0.9", "rollout.top_p", 0.9),
]
BASE = ["model.path=m", "data.train_file=t.jsonl"]


def _get(config, dotted):
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


@pytest.mark.parametrize(("override", "new", "value"), OLD_TO_NEW)
def test_an_old_key_sets_the_new_one_with_one_warning(tmp_path, override, new, value):
    import yaml

    from memrl.config import load_config, validate_config
    from memrl.deprecation import MemrlDeprecationWarning
    from memrl.recipes.config import TrainConfig

    old = override.partition("=")[0]
    message = f"{old} is deprecated: use {new} (the old name goes in the next release)"
    with pytest.warns(MemrlDeprecationWarning) as caught:  # as an override
        cfg = load_config(TrainConfig, None, [*BASE, override])
    assert [str(w.message) for w in caught] == [message]
    assert _get(cfg, new) == value
    section, key = old.split(".")  # in the file (and a plain dict)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"path": "m"}, "data": {"train_file": "t"},
                                    section: {key: value}}))
    with pytest.warns(MemrlDeprecationWarning, match=re.escape(message)):
        assert _get(load_config(TrainConfig, path), new) == value
    with pytest.warns(MemrlDeprecationWarning):
        data = {"model": {"path": "m"}, "data": {"train_file": "t"}, section: {key: value}}
        assert _get(validate_config(TrainConfig, data), new) == value


def test_old_and_new_key_together_is_an_error_but_an_override_wins(tmp_path):
    import yaml

    from memrl.config import load_config
    from memrl.deprecation import MemrlDeprecationWarning
    from memrl.errors import MemrlInputError
    from memrl.recipes.config import TrainConfig

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"path": "m"}, "data": {"train_file": "t"},
                                    "rollout": {"n": 8}, "rl": {"rollout_n": 4}}))
    with pytest.raises(MemrlInputError, match="rl.rollout_n: the deprecated name of rollout.n, "
                       "which is given too: keep only rollout.n"):
        load_config(TrainConfig, path)
    with pytest.warns(MemrlDeprecationWarning):  # overrides apply in order, as always
        cfg = load_config(TrainConfig, None, [*BASE, "rl.rollout_n=3", "rollout.n=5"])
    assert cfg.rollout.n == 5
    # a new file, an old override (or the reverse): the override
    path.write_text(yaml.safe_dump({"model": {"path": "m"}, "data": {"train_file": "t"},
                                    "rollout": {"n": 8}, "memagent": {"chunk_size": 64}}))
    with pytest.warns(MemrlDeprecationWarning):
        assert load_config(TrainConfig, path, ["rl.rollout_n=2"]).rollout.n == 2
    path.write_text(yaml.safe_dump({"model": {"path": "m"}, "data": {"train_file": "t"},
                                    "rl": {"rollout_n": 8}}))
    with pytest.warns(MemrlDeprecationWarning):
        assert load_config(TrainConfig, path, ["rollout.n=2"]).rollout.n == 2


def test_the_agent_sections_sampling_moves_for_any_agent():
    """memupdate's (and a plug-in's) temperature / top_p are training's too, as before."""
    from memrl.config import load_config
    from memrl.deprecation import MemrlDeprecationWarning
    from memrl.recipes.config import TrainConfig

    with pytest.warns(MemrlDeprecationWarning, match="memupdate.temperature is deprecated"):
        cfg = load_config(TrainConfig, None, [*BASE, "agent=memupdate",
                                              "memupdate.embedder=hashing",
                                              "memupdate.temperature=0.3"])
    assert cfg.rollout.temperature == 0.3 and cfg.memupdate.temperature == 0.7


def test_old_keys_train_as_the_new_ones():
    """The same values reach the same places: a config written with the old keys equals the
    shipped quickstart config once loaded."""
    from pathlib import Path

    from memrl.config import load_config, load_yaml, validate_config
    from memrl.deprecation import MemrlDeprecationWarning
    from memrl.recipes.config import TrainConfig

    path = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
    new = load_yaml(path)
    old = {k: v for k, v in new.items() if k != "rollout"}
    rollout = new["rollout"]
    old["memagent"] = {**new["memagent"], "temperature": rollout["temperature"],
                       "top_p": rollout["top_p"]}
    old["rl"] = {**new["rl"], "rollout_n": rollout["n"], "val_n": rollout["val"]["n"],
                 "val_temperature": rollout["val"]["temperature"]}
    with pytest.warns(MemrlDeprecationWarning):
        from_old = validate_config(TrainConfig, old)
    assert from_old == load_config(TrainConfig, path)


def test_the_cli_says_a_renamed_key_in_one_warning_line(tmp_path, capsys):
    from memrl.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("model: {path: m}\ndata: {train_file: t}\nrl: {rollout_n: 2, bogus: 1}\n")
    assert main(["train", str(path), "rl.val_n=2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "warning: rl.rollout_n is deprecated: use rollout.n (the old name goes in the next "
        "release)",
        "warning: rl.val_n is deprecated: use rollout.val.n (the old name goes in the next "
        "release)",
        f"error: {path} + overrides: rl.bogus: unknown key",
    ]


def test_eval_agent_samples_as_the_configs_rollout_where_it_is_given():
    from memrl.cli.evaluate_agent import sampling_as_rollout
    from memrl.config import load_config
    from memrl.deprecation import MemrlDeprecationWarning
    from memrl.recipes.config import TrainConfig

    def sampling(*sets):
        cfg = sampling_as_rollout(load_config(TrainConfig, None, [*BASE, *sets]))
        return cfg.memagent.temperature, cfg.memagent.top_p

    assert sampling() == (0.7, 0.95)  # the agent's own defaults
    assert sampling("rollout.temperature=0") == (0.0, 0.95)
    with pytest.warns(MemrlDeprecationWarning):  # the old key, as before: greedy
        assert sampling("memagent.temperature=0", "memagent.top_p=1.0") == (0.0, 1.0)


# ---- CLI options: --samples -> --n, --batch-size -> --generation-batch-size
def test_old_option_names_are_rewritten_with_one_warning_each():
    from memrl.cli import renamed_options
    from memrl.deprecation import MemrlDeprecationWarning

    with pytest.warns(MemrlDeprecationWarning) as caught:
        argv = renamed_options(["eval", "agent", "--samples", "2", "--batch-size=8", "--n", "3",
                                "--", "--samples"])
    assert argv == ["eval", "agent", "--n", "2", "--generation-batch-size=8", "--n", "3", "--",
                    "--samples"]
    assert [str(w.message) for w in caught] == [
        "--samples is deprecated: use --n (the old name goes in the next release)",
        "--batch-size is deprecated: use --generation-batch-size (the old name goes in the "
        "next release)"]


def test_old_eval_options_still_work_and_warn(tiny_model_dir, tmp_path, capsys):
    """`memrl eval agent --samples 2 --batch-size 4` runs as `--n 2 --generation-batch-size
    4`, with one warning line per old name; neither old name is in the help."""
    from memrl.cli import main
    from memrl.data.hotpotqa import save_records_jsonl
    from memrl.data.synthetic import make_synthetic_records

    data = tmp_path / "q.jsonl"
    save_records_jsonl(make_synthetic_records(2, num_docs=2, seed=0), data)
    out = tmp_path / "eval"
    assert main(["eval", "agent", "--model", str(tiny_model_dir), "--data", str(data),
                 "--out", str(out), "--samples", "2", "--batch-size", "4", "--quiet",
                 "--set", "memagent.chunk_size=48", "--set", "memagent.max_chunks=1",
                 "--set", "memagent.max_memory_tokens=2",
                 "--set", "memagent.max_final_tokens=2"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    assert err == [
        "warning: --samples is deprecated: use --n (the old name goes in the next release)",
        "warning: --batch-size is deprecated: use --generation-batch-size (the old name goes "
        "in the next release)"]
    rows = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(rows) == 4  # 2 records x --n 2
    options = {opt for command in ("ruler-hqa", "locomo", "agent")
               for opt in _options("eval", command)}
    assert {"--n", "--generation-batch-size"} <= options
    assert not {"--samples", "--batch-size"} & (options | set(_options("ask")))


def _options(*path):
    """Every option name of the command at `path` (`memrl eval agent`: "eval", "agent")."""
    import typer

    from memrl.cli import main
    from memrl.cli.app import app

    main(["--help"])  # registers every command
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return [opt for param in command.params for opt in param.opts]


def test_hf_engine_max_batch_size_is_the_old_name_of_generation_batch_size(tiny_model_dir):
    from memrl.inference import HFEngine
    from memrl.inference.loader import load_pretrained

    model, tokenizer = load_pretrained(str(tiny_model_dir), device="cpu")
    with pytest.warns(DeprecationWarning, match=re.escape(
            "HFEngine(max_batch_size=) is deprecated: use HFEngine(generation_batch_size=)")):
        engine = HFEngine(model, tokenizer, max_batch_size=3)
    assert engine.generation_batch_size == 3


@pytest.mark.parametrize("agent", ["memagent", "memupdate"])
def test_a_saved_config_reads_back_the_same_without_a_warning(tmp_path, agent):
    """A run's config.yaml holds rollout's sampling, not the agent section's (which, read
    back, would be the deprecated name of rollout's)."""
    import warnings

    from memrl.config import config_to_yaml, load_config, load_yaml
    from memrl.deprecation import MemrlDeprecationWarning
    from memrl.recipes.config import TrainConfig

    extra = ["memupdate.embedder=hashing"] if agent == "memupdate" else []
    cfg = load_config(TrainConfig, None, [*BASE, f"agent={agent}", "rollout.temperature=1.0",
                                          *extra])
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    assert not {"temperature", "top_p"} & load_yaml(path)[agent].keys()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemrlDeprecationWarning)
        assert load_config(TrainConfig, path) == cfg

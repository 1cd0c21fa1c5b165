"""Issue 9 (inputs) through `memrl.cli.main`: every malformed input is one line on stderr,
`error: <location>: <message>`, exit code 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.errors import MemrlInputError

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, args: list[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> str:
    """The single stderr line, checked: starts with `error: `, names every needle."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ") and line[len("error: "):].strip(), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


# ----------------------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["eval", "--num-docs", "abc"],
         ["memrl eval:", "--num-docs", "see 'memrl eval --help'"]),
        (["eval", "--resume=x"], ["memrl eval:", "--resume"]),
        (["init-tiny-model"], ["memrl init-tiny-model:", "Missing argument", "out_dir"]),
        (["init-tiny-model", "DIR", "--bogus"], ["memrl init-tiny-model:", "--bogus"]),
        (["init-tiny-model", "DIR", "--seed", "1"], ["memrl init-tiny-model:", "--seed"]),
        (["no-such-command"], ["memrl:", "no-such-command"]),
        (["train"], ["memrl train:", "Missing argument"]),
    ],
)
def test_usage_errors_are_one_line(capsys, args, needles):
    code, out, err = run(capsys, args)
    assert code == 2
    assert out == ""
    one_error_line(err, *needles)


@pytest.mark.parametrize("args", [[], ["prepare"]])
def test_missing_command_prints_help_then_one_error_line(capsys, args):
    code, out, err = run(capsys, args)
    assert code == 2
    assert "Usage:" in out and "Commands" in out
    one_error_line(err, " ".join(["memrl", *args]) + ": missing command")


def test_help_still_exits_0(capsys):
    code, out, err = run(capsys, ["eval", "--help"])
    assert code == 0 and "eval.benchmarks" in out and err == ""


@pytest.mark.parametrize(("args", "needles"), [
    (["eval"], ["model: Field required"]),
    (["eval", "nope"], ["nope"]),
    (["eval", "c.yaml", "nope"], ["'nope' is not of the form key.path=value"]),
])
def test_eval_without_a_config_or_with_a_stray_word_is_one_line(capsys, args, needles):
    code, out, err = run(capsys, args)
    assert code == 2
    one_error_line(err, *needles)


def test_usage_error_in_a_real_process():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "memrl", "eval", "--num-docs", "abc"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    one_error_line(result.stderr, "memrl eval:", "--num-docs")


# ----------------------------------------------------------------------------- config YAML


def _config(tmp_path: Path, content: str | bytes) -> Path:
    p = tmp_path / "train.yaml"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


@pytest.mark.parametrize(
    ("content", "line", "needles"),
    [
        ("optim:\n  lr: 0.001\nseed: 1\noptim:\n  weight_decay: 0.0\n", 4,
         ["duplicate key 'optim'", "line 1", "line 4"]),
        ("rl:\n  rollout_n: 4\n  rollout_n: 8\n", 3, ["duplicate key 'rollout_n'", "line 2"]),
        (b"seed: 1\nname: caf\xe9\n", 2, ["not valid UTF-8"]),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", None, ["binary file"]),
        ("seed: [1\n", 2, ["invalid YAML"]),
    ],
)
def test_bad_config_files_are_one_line(capsys, tmp_path, content, line, needles):
    p = _config(tmp_path, content)
    code, _, err = run(capsys, ["train", str(p)])
    assert code == 2
    location = f"{p}:{line}:" if line else f"{p}:"
    one_error_line(err, location, *needles)


def test_unreadable_config_is_one_line(capsys, tmp_path, monkeypatch):
    p = _config(tmp_path, "seed: 1\n")
    real = Path.read_bytes

    def read_bytes(self):
        if self == p:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    code, _, err = run(capsys, ["train", str(p)])
    assert code == 2
    one_error_line(err, f"{p}: cannot read config file: Permission denied")


def test_missing_config_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, ["train", str(tmp_path / "nope.yaml")])
    assert code == 2
    one_error_line(err, "nope.yaml: config file not found")


# ----------------------------------------------------------------------------- secrets


@pytest.mark.parametrize("secret", ["ghp_0123456789abcdefXYZ", "s3c"])
def test_secret_in_an_override_key_is_not_echoed(capsys, tmp_path, monkeypatch, secret):
    monkeypatch.setenv("MEMRL_TEST_PAT", secret)
    p = _config(tmp_path, "{}\n")
    for override in [f"model.{secret}=1", secret, f"{secret}.x.=1"]:
        code, _, err = run(capsys, ["train", str(p), override])
        assert code == 2
        one_error_line(err, "***")
        assert secret not in err


def test_error_lines_scrub_secrets_from_any_message(capsys, monkeypatch):
    monkeypatch.setenv("SERVICE_AUTH", "zz9")
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")

    def boom(*args, **kwargs):
        raise MemrlInputError("token hf_abcdefghijklmnop and zz9 but not zz99\nsecond line",
                              location="zz9.json")

    monkeypatch.setattr("memrl.models.tiny.build_tiny_model", boom)
    code, _, err = run(capsys, ["init-tiny-model", "out"])
    assert code == 2
    line = one_error_line(err)
    assert line == "error: ***.json: token *** and *** but not zz99 second line"


# ----------------------------------------------------------------------------- init-tiny-model


@pytest.mark.parametrize("size", ["0", "100", "258", "-5"])
def test_vocab_size_below_minimum_is_one_line(capsys, tmp_path, size):
    out_dir = tmp_path / "m"
    code, _, err = run(capsys, ["init-tiny-model", str(out_dir), f"vocab_size={size}"])
    assert code == 2
    one_error_line(err, "vocab_size:", "at least 259", f"got {size}")
    assert not out_dir.exists()


def test_unwritable_model_dir_is_one_line(capsys, tmp_path, monkeypatch):
    def denied(out_dir, **kwargs):
        raise PermissionError(13, "Permission denied", str(Path(out_dir) / "config.json"))

    monkeypatch.setattr("memrl.models.tiny.build_tiny_model", denied)
    code, _, err = run(capsys, ["init-tiny-model", str(tmp_path / "m")])
    assert code == 2
    one_error_line(err, "config.json: cannot write the model: Permission denied")


def test_keyboard_interrupt_is_exit_130_one_line(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("memrl.models.tiny.build_tiny_model", interrupted)
    code, _, err = run(capsys, ["init-tiny-model", "out"])
    assert code == 130
    assert err.splitlines() == [
        "interrupted (SIGINT) in 'memrl init-tiny-model'; run the command again to redo it"
    ]


def test_an_interrupted_quickstart_says_the_same_command_continues(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("memrl.apps.quickstart.run_quickstart", interrupted)
    code, _, err = run(capsys, ["quickstart"])
    assert code == 130
    assert err.splitlines() == [
        "interrupted (SIGINT) in 'memrl quickstart'; run the same command again to continue "
        "where it stopped (--fresh starts over)"
    ]


def test_quickstart_reads_its_config_keys_and_its_own(capsys, monkeypatch, tmp_path):
    """`memrl quickstart [CONFIG] [key=value ...] [--fresh]`: the GRPO config and its
    overrides, the quickstart's own keys under `quickstart.`, unknown ones one line."""
    calls = []
    monkeypatch.setattr("memrl.apps.quickstart.run_quickstart",
                        lambda *args, **kwargs: calls.append((args, kwargs)))
    assert run(capsys, ["quickstart"])[0] == 0
    (config, overrides), kwargs = calls.pop()
    assert (str(config), overrides, kwargs["fresh"]) == ("configs/quickstart.yaml", [], False)
    assert str(kwargs["sft_config_path"]) == "configs/quickstart_sft.yaml"
    assert kwargs["plan"].threads == 1
    code, _, _ = run(capsys, ["quickstart", "my.yaml", "trainer.total_steps=5",
                              "quickstart.threads=0", f"quickstart.sft_config={tmp_path}/s.yaml",
                              "--fresh"])
    (config, overrides), kwargs = calls.pop()
    assert code == 0 and (str(config), overrides) == ("my.yaml", ["trainer.total_steps=5"])
    assert kwargs["fresh"] and kwargs["plan"].threads is None
    assert kwargs["sft_config_path"] == tmp_path / "s.yaml"
    code, _, err = run(capsys, ["quickstart", "quickstart.thread=2"])
    assert code == 2 and not calls
    one_error_line(err, "quickstart.thread: unknown key")


# ----------------------------------------------------------------------------- LoCoMo


def test_locomo_nan_answer_is_one_line(capsys, tmp_path):
    data = [{
        "sample_id": "conv-7",
        "conversation": {
            "session_1_date_time": "1 pm on 1 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hi."}],
        },
        "observation": {},
        "qa": [
            {"question": "Q0?", "answer": "a", "evidence": ["D1:1"], "category": 4},
            {"question": "Q1?", "answer": 0, "evidence": ["D1:1"], "category": 4},
        ],
    }]
    src = tmp_path / "locomo10.json"
    src.write_text(json.dumps(data).replace('"answer": 0', '"answer": NaN'))
    code, _, err = run(capsys, ["prepare", "locomo", "--input", str(src),
                                "--out", str(tmp_path / "out")])
    assert code == 2
    one_error_line(err, f"{src}: [0].qa[1].answer:", "finite")


# ------------------------------------------------------- devices and seeds of every evaluation

EVAL_COMMANDS = [["agent=memagent", "eval.benchmarks=[ruler-hqa={data}]", "eval.num_docs=[2]"],
                 ["agent=memupdate", "eval.benchmarks=[locomo={data}]"],
                 ["agent=long-context", "eval.benchmarks=[ruler-hqa={data}]", "eval.num_docs=[2]"]]


@pytest.mark.parametrize("command", EVAL_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("option", "needles"),
    [
        (["seed=1000000000000000000000000000000"], ["seed", "less than or equal to"]),
        (["seed=-1"], ["seed", "greater than or equal to 0"]),
        (["model.device=cuda:99"], ["model.device", "'cuda:99' asked for", "CUDA GPU"]),
        (["model.device=warp9"], ["model.device", "unknown device 'warp9'"]),
    ],
    ids=["huge-seed", "negative-seed", "missing-gpu", "unknown-device"],
)
def test_eval_devices_and_seeds_are_one_line(capsys, tmp_path, tiny_model_dir, command, option,
                                             needles):
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval_2.json").write_text("[]")
    (data / "episodes.jsonl").write_text("")
    code, _, err = run(capsys, ["eval", *(c.format(data=data) for c in command),
                                f"model.path={tiny_model_dir}",
                                f"eval.out_dir={tmp_path / 'out'}", *option])
    assert code == 2
    one_error_line(err, *needles)

from __future__ import annotations

import io
import json
import sys
import types

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memrl.errors import MemrlInputError, MissingDependencyError
from memrl.run.metrics import (
    MetricsLogger,
    format_console_line,
    is_secret_key,
    plot_training_curves,
    read_metrics,
    scrub_env_secrets,
    scrub_secrets,
    truncate_metrics,
)

SECRET = "sk-live-9f8e7d6c5b4a"


def _without_time(records):
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


# ----------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    "name",
    ["api_key", "WANDB_API_KEY", "apiKey", "hf_token", "HF_TOKEN", "password", "db_password",
     "client_secret", "secrets", "openai.apikey", "access-token", "keys"],
)
def test_secret_keys(name):
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    ["max_tokens_per_micro_batch", "tokenizer", "keep_last", "lr", "monkey_patch",
     "num_tokens", "path", "wandb_project", "TOKENIZERS_PARALLELISM"],
)
def test_not_secret_keys(name):
    assert not is_secret_key(name)


def test_scrub_secrets_nested_and_env_values():
    env = {"WANDB_API_KEY": SECRET, "DEBUG_TOKEN": "1", "HOME": "/root"}
    config = {
        "model": {"path": "/models/q", "api_key": "abc", "hf_token": None},
        "rl": {"max_tokens_per_micro_batch": 16384},
        "servers": [{"url": f"http://h?key={SECRET}", "Password": 3}],
        "note": ("x", SECRET),
    }
    assert scrub_secrets(config, env) == {
        "model": {"path": "/models/q", "api_key": "***", "hf_token": None},
        "rl": {"max_tokens_per_micro_batch": 16384},
        "servers": [{"url": "http://h?key=***", "Password": "***"}],
        "note": ["x", "***"],
    }
    # Short values ("1") are scrubbed from text only as whole tokens (not inside "b12").
    assert scrub_env_secrets(f"a {SECRET} b12 1", env) == "a *** b12 ***"
    assert config["model"]["api_key"] == "abc"  # the input is not modified


# ----------------------------------------------------------------------------- logger


def test_jsonl_records_prefix_and_number_types(tmp_path):
    with MetricsLogger(tmp_path, sinks=["jsonl"]) as log:
        log.log(1, {"reward_mean": 0.5, "n": np.int64(3)}, prefix="train")
        log.log(1, {"score": torch.tensor(0.25), "ok": True}, prefix="val")
        log.log(2, {"loss": float("nan")})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert all(isinstance(r["time"], float) for r in records)
    assert _without_time(records)[:2] == [
        {"step": 1, "train/reward_mean": 0.5, "train/n": 3},
        {"step": 1, "val/score": 0.25, "val/ok": 1},
    ]
    assert records[2]["step"] == 2 and np.isnan(records[2]["loss"])
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line) for line in lines)


def test_logger_rejects_bad_metrics_and_sinks(tmp_path):
    with MetricsLogger(tmp_path, sinks=["jsonl"]) as log:
        with pytest.raises(ValueError, match="reserved"):
            log.log(1, {"step": 1.0})
        with pytest.raises(TypeError, match="'x' must be a number"):
            log.log(1, {"x": [1, 2]})
    with pytest.raises(MemrlInputError, match="unknown log sink 'csv'"):
        MetricsLogger(tmp_path, sinks=["csv"])


def test_jsonl_is_flushed_per_line(tmp_path):
    log = MetricsLogger(tmp_path, sinks=["jsonl"])
    log.log(4, {"a": 1.0})
    # Readable before close: a killed run keeps every line it logged.
    assert _without_time(read_metrics(tmp_path / "metrics.jsonl")) == [{"step": 4, "a": 1.0}]
    log.close()


def test_console_line():
    row = {"train/reward_std": 0.125, "actor/lr": 1e-6, "train/reward_mean": 0.5, "val/score": 0.4}
    assert format_console_line(3, row) == (
        "[cyan]step 3[/cyan] │ [dim]reward_mean[/dim] [bold]0.5±0.125[/bold] │ "
        "[dim]val/score[/dim] [bold]0.4[/bold] │ [dim]lr[/dim] [bold]1e-06[/bold]"
    )
    many = {f"m{i}": float(i) for i in range(10)}
    assert format_console_line(1, many).endswith("[dim](+4 more)[/dim]")


def test_console_labels_that_would_read_the_same_keep_their_section():
    """PPO logs the actor's and the critic's gradient norm: "grad_norm 29.99 │ grad_norm
    0.2046" did not say which was which."""
    row = {"actor/grad_norm": 30.0, "critic/grad_norm": 0.25, "actor/pg_loss": 0.5}
    assert format_console_line(2, row) == (
        "[cyan]step 2[/cyan] │ [dim]pg_loss[/dim] [bold]0.5[/bold] │ "
        "[dim]actor/grad_norm[/dim] [bold]30[/bold] │ "
        "[dim]critic/grad_norm[/dim] [bold]0.25[/bold]"
    )


def test_console_sink_prints_one_line(tmp_path):
    from rich.console import Console

    buf = io.StringIO()
    with MetricsLogger(tmp_path, sinks=["console"], console=Console(file=buf, width=300)) as log:
        log.log(7, {"reward_mean": 0.75, "reward_std": 0.5}, prefix="train")
    assert buf.getvalue() == "step 7 │ reward_mean 0.75±0.5\n"
    assert not (tmp_path / "metrics.jsonl").exists()


def test_console_every_prints_every_nth_step_and_every_validation(tmp_path):
    from rich.console import Console

    buf = io.StringIO()
    with MetricsLogger(tmp_path, sinks=["console", "jsonl"], console_every=3,
                       console=Console(file=buf, width=300)) as log:
        for step in range(1, 8):
            log.log(step, {"nll": 1.0, **({"val/nll": 2.0} if step == 4 else {})})
    assert [line.split(" │ ")[0] for line in buf.getvalue().splitlines()] == [
        "step 3", "step 4", "step 6"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 7


def test_tensorboard_sink_scalars_and_scrubbed_config(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    config = {"trainer": {"out_dir": "runs/x"}, "openai": {"api_key": "plain-key-value"},
              "note": f"key is {SECRET}"}
    with MetricsLogger(tmp_path, sinks=["tensorboard"], run_config=config) as log:
        log.log(1, {"reward_mean": 0.25}, prefix="train")
        log.log(2, {"reward_mean": 0.5, "phase": "rollout"}, prefix="train")
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("train/reward_mean")
    assert [(e.step, e.value) for e in events] == [(1, 0.25), (2, 0.5)]
    everything = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b"runs/x" in everything  # the config was written ...
    assert SECRET.encode() not in everything  # ... without secrets
    assert b"plain-key-value" not in everything


def test_missing_tensorboard_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import fails as if uninstalled
    with pytest.raises(MissingDependencyError, match=r"'tensorboard'.*memrl\[tensorboard\]"):
        MetricsLogger(tmp_path, sinks=["jsonl", "tensorboard"])


def test_missing_wandb_is_a_clear_error(tmp_path):
    with pytest.raises(MissingDependencyError, match=r"'wandb'.*pip install 'memrl\[wandb\]'"):
        MetricsLogger(tmp_path, sinks=["jsonl", "wandb"])


class _FakeRun:
    def __init__(self, calls):
        self.calls = calls

    def log(self, row, step):
        self.calls.append(("log", row, step))

    def finish(self):
        self.calls.append(("finish",))


def _fake_wandb(monkeypatch):
    calls: list = []
    fake = types.ModuleType("wandb")
    fake.util = types.SimpleNamespace(generate_id=lambda: "run123")

    def init(**kwargs):
        calls.append(("init", kwargs))
        return _FakeRun(calls)

    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return calls


def test_wandb_sink_needs_env_key_and_gets_scrubbed_config(tmp_path, monkeypatch):
    calls = _fake_wandb(monkeypatch)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(MemrlInputError, match="WANDB_API_KEY"):
        MetricsLogger(tmp_path, sinks=["wandb"])

    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    config = {"seed": 1, "remote": {"token": "t0k", "url": f"http://x/{SECRET}"}}
    with MetricsLogger(tmp_path, sinks=["wandb", "jsonl"], run_config=config,
                       wandb_project="proj") as log:
        log.log(3, {"score": 0.5}, prefix="val")
    init = calls[0][1]
    assert init["project"] == "proj" and init["id"] == "run123" and init["resume"] == "allow"
    assert init["config"] == {"seed": 1, "remote": {"token": "***", "url": "http://x/***"}}
    assert calls[1:] == [("log", {"val/score": 0.5}, 3), ("finish",)]
    assert SECRET not in json.dumps(init, default=str)
    assert SECRET not in (tmp_path / "metrics.jsonl").read_text()

    # A resumed run continues the same W&B run.
    fake = sys.modules["wandb"]
    fake.util.generate_id = lambda: "other"
    MetricsLogger(tmp_path, sinks=["wandb"]).close()
    assert calls[-2][1]["id"] == "run123"


def test_secret_in_string_metric_never_reaches_jsonl(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", SECRET)
    with MetricsLogger(tmp_path, sinks=["jsonl"]) as log:
        log.log(1, {"endpoint": f"https://api/{SECRET}"})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert SECRET not in text and "https://api/***" in text


# ----------------------------------------------------------------------------- files


def _write_lines(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_truncate_drops_later_steps_and_partial_tail(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write_lines(p, [{"step": 1, "a": 1}, {"step": 2, "a": 2}, {"step": 3, "a": 3}],
                 tail='{"step": 4, "a"')
    assert truncate_metrics(p, 2) == 2
    assert p.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'
    assert truncate_metrics(tmp_path / "none.jsonl", 5) == 0
    assert not (tmp_path / "none.jsonl").exists()


def test_read_metrics_errors_and_tail(tmp_path):
    p = tmp_path / "m.jsonl"
    _write_lines(p, [{"step": 1}], tail='{"step": 2}')  # whole record, newline lost
    assert read_metrics(p) == [{"step": 1}, {"step": 2}]
    p.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(MemrlInputError, match=r"m.jsonl:2: invalid JSON"):
        read_metrics(p)
    with pytest.raises(MemrlInputError, match=r"m.jsonl:2"):
        truncate_metrics(p, 1)
    p.write_text('{"x": 1}\n')
    with pytest.raises(MemrlInputError, match=r"m.jsonl:1: missing integer 'step'"):
        read_metrics(p)
    with pytest.raises(MemrlInputError, match="metrics file not found"):
        read_metrics(tmp_path / "missing.jsonl")


_records = st.lists(
    st.fixed_dictionaries(
        {"step": st.integers(0, 20), "v": st.floats(allow_nan=False, allow_infinity=False)}
    ),
    max_size=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=_records, cut=st.integers(0, 40), after=st.integers(-1, 21))
def test_truncate_property(tmp_path, records, cut, after):
    p = tmp_path / "prop.jsonl"
    partial = json.dumps({"step": 0, "v": 1.5})[:cut]  # any strict prefix is a killed write
    partial = partial if cut < len(json.dumps({"step": 0, "v": 1.5})) else ""
    _write_lines(p, records, tail=partial)
    kept = truncate_metrics(p, after)
    expected = [r for r in records if r["step"] <= after]
    assert kept == len(expected)
    assert read_metrics(p) == expected
    assert p.read_text().endswith("\n") or not expected


def test_resumed_run_metrics_equal_uninterrupted_run(tmp_path):
    def run(out, steps):
        with MetricsLogger(out, sinks=["jsonl"]) as log:
            for s in steps:
                log.log(s, {"reward_mean": s / 10}, prefix="train")

    run(tmp_path / "a", range(1, 6))
    b = tmp_path / "b"
    run(b, range(1, 5))
    with (b / "metrics.jsonl").open("a") as f:  # killed while writing step 5
        f.write('{"step": 5, "ti')
    truncate_metrics(b / "metrics.jsonl", after_step=2)  # resume from checkpoint step 2
    run(b, range(3, 6))
    assert _without_time(read_metrics(b / "metrics.jsonl")) == _without_time(
        read_metrics(tmp_path / "a" / "metrics.jsonl")
    )


def test_logger_opening_a_file_with_a_killed_half_line_repairs_it(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write_lines(p, [{"step": 1, "a": 1}], tail='{"step": 2, "a"')
    with MetricsLogger(tmp_path, sinks=["jsonl"]) as log:
        log.log(2, {"a": 2})
    assert _without_time(read_metrics(p)) == [{"step": 1, "a": 1}, {"step": 2, "a": 2}]


# ----------------------------------------------------------------------------- plot


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return data


def test_plot_with_reward_band_and_validation(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/score": 0.1}]
    rows += [{"step": s, "train/reward_mean": s / 10, "train/reward_std": 0.1} for s in (1, 2, 3)]
    rows += [{"step": 3, "val/score": 0.3}]
    _write_lines(p, rows)
    out = plot_training_curves(p, tmp_path / "plots" / "curves.png")
    assert out == tmp_path / "plots" / "curves.png"
    assert len(_png(out)) > 1000


def test_plot_without_validation_or_any_data(tmp_path):
    p = tmp_path / "metrics.jsonl"
    _write_lines(p, [{"step": 1, "train/reward_mean": 0.2}, {"step": 2, "train/reward_mean": 0.3}])
    _png(plot_training_curves(p, tmp_path / "a.png"))
    p.write_text("")
    _png(plot_training_curves(p, tmp_path / "b.png"))

"""Issue 21, item 2: `run.json`, a record of every run (memrl.run.record).

The record's pieces by hand (exit statuses, config hash, earlier records kept, main rank
only), then `memrl train`, `memrl sft` and `memrl eval` (RULER-HQA, LoCoMo) end to end on the
tiny model: the record's fields and its status on success, on a user error and on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from memrl.cli import main as cli_main
from memrl.config import load_config
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.errors import MemrlInputError
from memrl.interrupt import Interrupted
from memrl.recipes.config import TrainConfig
from memrl.recipes.sft_config import SFTConfig
from memrl.run.record import (
    RUN_FILE,
    config_hash,
    exit_status,
    launcher_name,
    package_version,
    read_record,
    recorded,
    summary_line,
)

ROOT = Path(__file__).resolve().parents[1]
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


# ------------------------------------------------------------------------ the pieces by hand


def test_exit_status_of_every_ending():
    assert exit_status(None) == {"status": "ok"}
    assert exit_status(SystemExit(0)) == {"status": "ok"}
    assert exit_status(Interrupted(signal.SIGTERM, "x")) == {
        "status": "interrupted", "signal": "SIGTERM", "exit_code": 143}
    assert exit_status(KeyboardInterrupt()) == {
        "status": "interrupted", "signal": "SIGINT", "exit_code": 130}
    user = exit_status(MemrlInputError("not found\n(second line)", location="data.train_file"))
    assert user == {"status": "error", "error": "data.train_file: not found (second line)",
                    "exit_code": 2}
    bug = exit_status(ValueError("bad value"))
    assert bug == {"status": "error", "error": "ValueError: bad value", "exit_code": 1}
    assert exit_status(SystemExit(3))["exit_code"] == 3


def test_config_hash_is_canonical():
    a = config_hash({"b": 1, "a": [1, 2]})
    assert a == config_hash({"a": [1, 2], "b": 1})  # key order does not matter
    assert a != config_hash({"a": [2, 1], "b": 1})
    assert a.startswith("sha256:") and len(a) == len("sha256:") + 64
    assert config_hash(None) is None
    cfg = load_config(TrainConfig, None, ["model.path=m", "data.train_file=t.jsonl"])
    same = load_config(TrainConfig, None, ["data.train_file=t.jsonl", "model.path=m", "seed=0"])
    assert config_hash(cfg) == config_hash(same)  # defaults written out count as given
    assert config_hash(cfg) != config_hash(cfg.model_copy(update={"seed": 1}))


def test_launcher_name_from_the_environment(monkeypatch):
    for key in ("WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    assert launcher_name() == "plain" and launcher_name("local") == "plain"
    assert launcher_name("ray") == "ray"
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert launcher_name("local") == "torchrun"
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert launcher_name() == "torchrun"


def test_a_record_says_running_during_the_block_and_ok_after(tmp_path):
    with recorded(tmp_path, "demo", config={"x": 1}, seed=7, engine="hf") as record:
        during = read_record(tmp_path)
        assert record.path == tmp_path / RUN_FILE
    after = read_record(tmp_path)
    assert during["status"] == "running" and during["ended_at"] is None
    assert after["status"] == "ok" and after["ended_at"] >= after["started_at"]
    assert after["duration_s"] >= 0 and after["seed"] == 7
    assert after["engine_version"] == package_version("transformers")
    assert after["config_hash"] == config_hash({"x": 1})


def test_earlier_records_are_kept_and_a_vanished_run_is_unfinished(tmp_path):
    with recorded(tmp_path, "first"):
        pass
    with recorded(tmp_path, "killed"):  # as if SIGKILL had stopped it mid-run:
        killed = read_record(tmp_path)
    (tmp_path / RUN_FILE).write_text(json.dumps(killed))
    with pytest.raises(ValueError), recorded(tmp_path, "third"):
        raise ValueError("boom")
    record = read_record(tmp_path)
    assert record["kind"] == "third" and record["status"] == "error"
    assert record["error"] == "ValueError: boom"
    assert [(p["kind"], p["status"]) for p in record["previous"]] == [
        ("first", "ok"), ("killed", "unfinished")]


def test_only_the_main_rank_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with recorded(tmp_path, "rank 1"):
        pass
    assert not (tmp_path / RUN_FILE).exists()
    with recorded(tmp_path, "rank 0", main=True):
        pass
    assert read_record(tmp_path)["kind"] == "rank 0"


def test_a_record_file_beside_a_results_file(tmp_path):
    with recorded(tmp_path / "bench.run.json", "benchmark x"):
        pass
    assert read_record(tmp_path / "bench.run.json")["status"] == "ok"


def test_secrets_never_reach_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "s3cr3t-value-123")
    with pytest.raises(MemrlInputError), recorded(tmp_path, "x", extra={"note": "ok"}):
        raise MemrlInputError("server said s3cr3t-value-123")
    assert "s3cr3t-value-123" not in (tmp_path / RUN_FILE).read_text()


def test_summary_line_by_hand():
    record = {"kind": "train", "status": "error", "error": "boom", "world_size": 8,
              "launcher": "torchrun", "strategy": "fsdp", "engine": "vllm",
              "engine_version": "0.32.0", "versions": {"python": "3.11", "torch": "2.13"},
              "devices": {"gpus": ["H100"] * 8, "cpu": "Xeon"}, "memrl": {
                  "git_commit": "0123456789abcdef", "git_dirty": False}, "seed": 3,
              "config_hash": "sha256:" + "ab" * 32, "started_at": "2026-01-01T00:00:00+00:00",
              "duration_s": 61.4}
    assert summary_line(record) == (
        "train: error (boom) · 8 × torchrun, fsdp · engine vllm 0.32.0 · torch 2.13 · "
        "8 × H100 · memrl 0123456789 · seed 3 · config abababababab · "
        "2026-01-01T00:00:00+00:00, 61 s")
    assert summary_line(record, with_status=False).startswith("train · 8 × torchrun")


# --------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("record_data")
    save_records_jsonl(make_synthetic_records(4, num_docs=2, seed=0, hops=1), d / "train.jsonl")
    return d


def train_yaml(path: Path, model_dir: Path, data_dir: Path, out: Path, **data) -> Path:
    cfg = {
        "seed": 5,
        "model": {"path": str(model_dir)},
        "data": {"train_file": str(data_dir / "train.jsonl"), "train_batch_size": 2, **data},
        "memagent": {"chunk_size": 48, "max_chunks": 2, "max_memory_tokens": 6,
                     "max_final_tokens": 6},
        "rollout": {"n": 2, "temperature": 1.0, "top_p": 1.0},
        "rl": {"ppo_mini_batch_size": 2, "overlong": "keep",
               "dynamic_sampling": False},
        "trainer": {"out_dir": str(out), "log_sinks": ["jsonl"], "total_steps": 1},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def sft_yaml(path: Path, model_dir: Path, data_dir: Path, out: Path, **data) -> Path:
    cfg = {
        "model": {"path": str(model_dir)},
        "data": {"train_file": str(data_dir / "train.jsonl"), **data},
        "memagent": {"chunk_size": 40, "max_memory_tokens": 64, "max_final_tokens": 24},
        "sft": {"batch_size": 2, "micro_batch_size": 3},
        "trainer": {"out_dir": str(out), "log_sinks": ["jsonl"], "total_steps": 1,
                    "val_before_train": False},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def git_head() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def assert_how_it_ran(record: dict, kind: str, engine: str | None, strategy: str | None) -> None:
    assert record["kind"] == kind
    assert record["world_size"] == 1 and record["launcher"] == "plain"
    assert record["strategy"] == strategy and record["engine"] == engine
    if engine == "hf":
        assert record["engine_version"] == package_version("transformers")
    versions = record["versions"]
    assert versions["torch"] == package_version("torch")
    assert versions["transformers"] == package_version("transformers")
    assert "vllm" in versions and versions["python"]
    assert record["devices"]["cpu"] and isinstance(record["devices"]["gpus"], list)
    source = record["memrl"]
    import memrl

    if (Path(memrl.__file__).resolve().parents[1] / ".git").exists() and git_head():
        assert source["git_commit"] == git_head() and isinstance(source["git_dirty"], bool)
    else:
        assert source["git_commit"] is None and source["version"]
    assert record["started_at"] <= record["ended_at"] and record["duration_s"] >= 0


def sigterm_on_first_call(monkeypatch, module, name: str) -> None:
    """`module.name` sends this process SIGTERM the first time it is called."""
    original = getattr(module, name)

    def first(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, first)


def assert_trained_ok(command: str, cfg: Path, out: Path, seed: int, engine: str | None
                      ) -> None:
    """`memrl COMMAND CFG` exits 0 and `out`'s record says how it ran, with status ok."""
    assert cli_main([command, str(cfg)]) == 0
    record = read_record(out)
    assert record["status"] == "ok" and record["seed"] == seed
    assert_how_it_ran(record, command, engine, "replicate")
    config_class = TrainConfig if command == "train" else SFTConfig
    assert record["config_hash"] == config_hash(load_config(config_class, cfg))
    assert isinstance(record["argv"], list) and record["cwd"] == os.getcwd()
    assert record["previous"] == []


@pytest.mark.slow
def test_train_records_success(tiny_model_dir, data_dir, tmp_path):
    cfg = train_yaml(tmp_path / "t.yaml", tiny_model_dir, data_dir, tmp_path / "run")
    assert_trained_ok("train", cfg, tmp_path / "run", 5, "hf")


def test_train_records_a_user_error(tiny_model_dir, data_dir, tmp_path, capsys):
    cfg = train_yaml(tmp_path / "t.yaml", tiny_model_dir, data_dir, tmp_path / "run",
                     train_file=str(tmp_path / "missing.jsonl"))
    assert cli_main(["train", str(cfg)]) == 2
    line = capsys.readouterr().err.strip()
    record = read_record(tmp_path / "run")
    assert record["status"] == "error" and record["exit_code"] == 2
    assert "missing.jsonl" in record["error"] and line == f"error: {record['error']}"


@posix_only
def test_train_records_sigterm(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    from memrl.recipes import grpo

    sigterm_on_first_call(monkeypatch, grpo, "train_step")
    cfg = train_yaml(tmp_path / "t.yaml", tiny_model_dir, data_dir, tmp_path / "run")
    assert cli_main(["train", str(cfg)]) == 143
    record = read_record(tmp_path / "run")
    assert (record["status"], record["signal"], record["exit_code"]) == (
        "interrupted", "SIGTERM", 143)
    assert record["ended_at"] is not None


@pytest.mark.slow
def test_sft_records_success_and_a_user_error(tiny_model_dir, data_dir, tmp_path):
    cfg = sft_yaml(tmp_path / "s.yaml", tiny_model_dir, data_dir, tmp_path / "run")
    assert_trained_ok("sft", cfg, tmp_path / "run", 0, None)

    bad = sft_yaml(tmp_path / "b.yaml", tiny_model_dir, data_dir, tmp_path / "bad",
                   trajectories=str(tmp_path / "missing.jsonl"))
    assert cli_main(["sft", str(bad)]) == 2
    record = read_record(tmp_path / "bad")
    assert record["status"] == "error" and "missing.jsonl" in record["error"]


@posix_only
def test_sft_records_sigterm(tiny_model_dir, data_dir, tmp_path, monkeypatch, capsys):
    from memrl.recipes import sft

    sigterm_on_first_call(monkeypatch, sft, "train_step")
    cfg = sft_yaml(tmp_path / "s.yaml", tiny_model_dir, data_dir, tmp_path / "run")
    assert cli_main(["sft", str(cfg)]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"interrupted (SIGTERM) during the warm start in {tmp_path / 'run'}; "
                   f"continue with: memrl sft {cfg} --resume"]
    record = read_record(tmp_path / "run")
    assert (record["status"], record["signal"]) == ("interrupted", "SIGTERM")


def ruler_dir(path: Path, broken: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    item = {"index": 0, "input": "Where was Ada born?", "answers": ["London"],
            "context": "Document 1:\nFact\nAda was born in London.\n\nDocument 2:\nX\nY",
            "num_docs": 2}
    (path / "eval_2.json").write_text("[{not json" if broken else json.dumps([item]))
    return path


def eval_args(model: Path, data: Path, out: Path) -> list[str]:
    return ["eval", f"model.path={model}", f"eval.benchmarks=[ruler-hqa={data}]",
            "eval.num_docs=[2]", "memagent.chunk_size=48", "memagent.max_memory_tokens=6",
            "memagent.max_final_tokens=6", "memagent.seed=3", "model.device=cpu",
            f"eval.out_dir={out}", "eval.progress=false"]


@pytest.mark.slow
def test_eval_records_success_and_heads_the_results_table(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    assert cli_main(eval_args(tiny_model_dir, ruler_dir(tmp_path / "data"), out)) == 0
    record = read_record(out)
    assert record["status"] == "ok" and record["seed"] == 3
    assert_how_it_ran(record, "eval", "hf", None)
    table = (out / "ruler-hqa" / "results.md").read_text()
    assert f"Run: {summary_line(record, with_status=False)}" in table
    # the same command again continues the run: the first record moves to `previous`
    assert cli_main(eval_args(tiny_model_dir, tmp_path / "data", out)) == 0
    again = read_record(out)
    assert [p["status"] for p in again["previous"]] == ["ok"]
    assert again["config_hash"] == record["config_hash"]


def test_eval_records_a_user_error(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    data = ruler_dir(tmp_path / "data", broken=True)
    assert cli_main(eval_args(tiny_model_dir, data, out)) == 2
    record = read_record(out)
    assert record["status"] == "error" and "eval_2.json" in record["error"]


@posix_only
@pytest.mark.parametrize("benchmark", ["ruler-hqa", "locomo"])
def test_eval_records_sigterm(tiny_model_dir, tmp_path, monkeypatch, benchmark):
    import memrl.eval.benchmark

    sigterm_on_first_call(monkeypatch, memrl.eval.benchmark, "evaluate_suite")
    data = ruler_dir(tmp_path / "data")
    (data / "episodes.jsonl").write_text("")
    out = tmp_path / "run"
    agent = "memagent" if benchmark == "ruler-hqa" else "memupdate"
    args = ["eval", f"agent={agent}", f"model.path={tiny_model_dir}",
            f"eval.benchmarks=[{benchmark}={data}]", f"eval.out_dir={out}",
            "eval.progress=false", "model.device=cpu"]
    assert cli_main(args + (["eval.num_docs=[2]"] if benchmark == "ruler-hqa" else [])) == 143
    record = read_record(out)
    assert (record["kind"], record["status"], record["signal"]) == (
        "eval", "interrupted", "SIGTERM")

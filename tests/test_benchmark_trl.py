"""The TRL side-by-side benchmark (benchmarks/trl_side_by_side.py): its prompt plug-in task
(benchmarks/prompt_task.py) and, when `trl` is installed, its tiny plan on a CPU (TRL without
vLLM beside memrl's HF engine), so the script's code paths run before the GPU run."""

from __future__ import annotations

import importlib.util
import json
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.errors import MemrlInputError
from memrl.run.record import read_record

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


prompt_task = load("prompt_task")


def test_parity_reward_hand_computed():
    # CRC-32 of 01 00 00 00 is 2583214201 (odd); of 01 00 00 00 02 00 00 00, 58791804 (even).
    assert prompt_task.parity_reward([1]) == 1.0
    assert prompt_task.parity_reward([1, 2]) == 0.0
    assert prompt_task.parity_reward([]) == 0.0  # CRC-32 of nothing is 0
    assert zlib.crc32((1).to_bytes(4, "little")) == 2583214201


def test_prompts_round_trip_and_errors(tmp_path):
    records = [prompt_task.PromptRecord("a", "x y", ("z",)), prompt_task.PromptRecord("b", "w")]
    path = tmp_path / "p.jsonl"
    prompt_task.save_prompts(records, path)
    assert prompt_task.load_prompts(path) == records
    for line, message in [('{"id": "a", "prompt": "x"}\n' * 2, "duplicate id"),
                          ('{"id": 1, "prompt": "x"}\n', "need"),
                          ('{"id": "a", "prompt": "x", "answers": [1]}\n', "answers"),
                          ("{not json\n", "not JSON")]:
        path.write_text(line)
        with pytest.raises(MemrlInputError, match=message):
            prompt_task.load_prompts(path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=40),
    st.dictionaries(st.sampled_from(["id", "prompt", "answers", "x"]),
                    st.one_of(st.text(max_size=5), st.integers(), st.lists(st.text(max_size=3)),
                              st.none()), max_size=4).map(json.dumps)), max_size=5))
def test_load_prompts_reads_or_names_the_line(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("p") / "p.jsonl"
    path.write_text("\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines))
    try:
        records = prompt_task.load_prompts(path)
    except MemrlInputError as exc:
        assert str(path) in str(exc)
    else:
        assert len({r.id for r in records}) == len(records)
        assert all(isinstance(r.prompt, str) for r in records)


@pytest.mark.pipeline
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                    reason="trl is not installed (pip install -e '.[bench]')")
def test_tiny_plan_runs_both_frameworks(tmp_path):
    bench = load("trl_side_by_side")
    out = tmp_path / "trl.json"
    summary = bench.main(["--plan", "tiny", "--work", str(tmp_path / "work"), "--out",
                          str(out), "--device", "cpu"])
    (entry,) = summary["models"]
    trl, memrl = entry["trl"], entry["memrl"]
    assert "error" not in trl, trl.get("log_tail")
    assert "error" not in memrl, memrl.get("log_tail")
    batch = summary["settings"]["answers_per_step"]
    for side in (trl, memrl):
        assert side["measured_steps"] == [2]  # 2 steps, the first one warm-up
        for row in side["steps"]:
            # the same work: every answer exactly 16 tokens, the same prompts in each step
            assert row["samples"] == batch and row["response_tokens"] == 16 * batch
            assert row["rollout_s"] + row["update_s"] == pytest.approx(row["step_s"])
            assert 0 < row["rollout_s"] < row["step_s"]
    assert [r["prompt_tokens"] for r in trl["steps"]] == \
        [r["prompt_tokens"] for r in memrl["steps"]]
    assert entry["step_time_ratio_vs_trl"] == pytest.approx(memrl["step_s"] / trl["step_s"])
    assert summary["step_time_ratio_vs_trl"] == {"tiny": entry["step_time_ratio_vs_trl"]}
    assert "step_time_ratio_vs_trl_tuned" not in summary and "memrl_tuned" not in entry
    assert summary["mfu"] == {"tiny": {}}  # no known peak on a CPU
    assert json.loads(out.read_text())["models"][0]["model"] == "tiny"
    record = read_record(tmp_path / "trl.run.json")
    assert (record["kind"], record["status"]) == ("benchmark trl_side_by_side", "ok")

    # memrl alone, tuned (its own options on top: packed micro-batches) on the model
    # directory of the first run, its old log-probs from the update's forward (on-policy:
    # no separate pass), then both runs merged into one
    model = tmp_path / "work" / "tiny" / "model"
    alone = bench.main(["--plan", "tiny", "--work", str(tmp_path / "w2"), "--out",
                        str(tmp_path / "memrl.json"), "--frameworks", "memrl_tuned",
                        "--memrl-set", "rl.remove_padding=true",
                        "--model-dir", f"tiny={model}", "--device", "cpu",
                        "--memrl-old-logprobs", "auto"])
    assert alone["models"][0]["model_info"]["dir"] == str(model)
    assert summary["settings"]["memrl_old_logprobs"] == "recompute"
    assert alone["settings"]["memrl_old_logprobs"] == "auto"
    tuned = alone["models"][0]["memrl_tuned"]
    assert "error" not in tuned, tuned.get("log_tail")
    assert tuned["memrl_set"] == ["rl.remove_padding=true"]
    assert tuned["config"]["rl"]["remove_padding"] is True
    assert tuned["config"]["rl"]["old_logprobs"] == "auto"
    assert memrl["config"]["rl"]["remove_padding"] is False
    separate = memrl["mean_excluding_warmup"]["logprobs_s"]
    skipped = tuned["mean_excluding_warmup"]["logprobs_s"]
    assert skipped < 0.1 * separate, (skipped, separate)
    assert "trl" not in alone["models"][0] and "memrl" not in alone["models"][0]
    assert alone["step_time_ratio_vs_trl"] == {"tiny": None}
    assert alone["step_time_ratio_vs_trl_tuned"] == {"tiny": None}
    merged = bench.main(["--merge", str(out), str(tmp_path / "memrl.json"), "--out",
                         str(tmp_path / "merged.json")])
    assert [m["model"] for m in merged["models"]] == ["tiny", "tiny"]
    assert len(merged["merged_from"]) == 2
    assert merged["step_time_ratio_vs_trl_tuned"] == {"tiny (run 2)": None}
    assert [r["settings"]["memrl_old_logprobs"] for r in merged["merged_from"]] == \
        ["recompute", "auto"]
    assert merged["merged_from"][1]["memrl_set"] == ["rl.remove_padding=true"]


def test_bad_memrl_set_is_one_line(capsys):
    bench = load("trl_side_by_side")
    for argv, message in [(["--memrl-set", "rl"], "key.path=value"),
                          (["--frameworks", "memrl_tuned"], "go together"),
                          (["--frameworks", "trl", "--memrl-set", "rl.x=1"], "go together"),
                          (["--memrl-set", "rl.no_such_key=1", "--device", "cpu"],
                           "rl.no_such_key: unknown key")]:
        with pytest.raises(SystemExit):
            bench.parse_args(["--plan", "tiny", *argv])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert message in err, err
    args = bench.parse_args(["--plan", "tiny", "--memrl-set", "rl.remove_padding=true"])
    assert args.frameworks == ["trl", "memrl", "memrl_tuned"]


def test_memrl_set_reads_keys_as_memrl_train(tmp_path):
    bench = load("trl_side_by_side")
    args = bench.parse_args(["--plan", "tiny", "--memrl-set", "rollout.n=4",
                             "--device", "cpu"])
    spec = bench.side_spec(args, "tiny", tmp_path / "model", tmp_path / "p.jsonl", "cpu")
    config = bench.memrl_config(spec, tmp_path / "run", tuned=True)
    assert config.rollout.n == 4 and bench.memrl_config(spec, tmp_path / "run").rollout.n == 8


def test_per_model_keys_a_model_that_comes_again():
    bench = load("trl_side_by_side")
    side = {"mean_excluding_warmup": {"perf/mfu": 0.2}}
    models = [{"model": "m", "step_time_ratio_vs_trl": 0.9, "memrl": side},
              {"model": "m", "step_time_ratio_vs_trl": 0.7, "step_time_ratio_vs_trl_tuned": 0.5,
               "memrl_tuned": side}]
    got = bench.per_model(models)
    assert got["step_time_ratio_vs_trl"] == {"m": 0.9, "m (run 2)": 0.7}
    assert got["step_time_ratio_vs_trl_tuned"] == {"m (run 2)": 0.5}
    assert got["mfu"] == {"m": {"memrl": 0.2}, "m (run 2)": {"memrl_tuned": 0.2}}


def test_memrl_set_unknown_key_is_located(tmp_path):
    bench = load("trl_side_by_side")
    args = bench.parse_args(["--plan", "tiny", "--memrl-set", "rl.remove_padding=true",
                             "--device", "cpu"])
    spec = bench.side_spec(args, "tiny", tmp_path / "model", tmp_path / "p.jsonl", "cpu")
    spec["memrl_set"] = ["rl.no_such_key=1"]  # parse_args refuses it (above): the child's check
    with pytest.raises(MemrlInputError, match=r"--memrl-set.*rl.no_such_key: unknown key"):
        bench.memrl_config(spec, tmp_path / "run", tuned=True)
    assert bench.memrl_config(spec, tmp_path / "run").rl.remove_padding is False

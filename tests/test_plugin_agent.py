"""An agent written outside memrl (examples/mem1: a MEM1-style agent in two files) trains
with `memrl train` and is evaluated with `memrl eval agent=package.module:Class` by import path, with no edit to
memrl; `memrl view` renders its rows. The same commands a user runs, in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memrl.data.hotpotqa import save_records
from memrl.data.synthetic import make_synthetic_records

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TASK = "mem1.task:Mem1Task"


def env() -> dict[str, str]:
    out = dict(os.environ)
    paths = (str(EXAMPLES), str(ROOT), out.get("PYTHONPATH"))
    out.update(PYTHONPATH=os.pathsep.join(p for p in paths if p), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return out


def memrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memrl", *args], env=env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def questions(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mem1") / "q.jsonl"
    return save_records(make_synthetic_records(4, num_docs=2, seed=3), path)


def test_the_plugin_is_not_part_of_memrl():
    assert not (ROOT / "memrl" / "mem1").exists()
    assert "mem1" not in (ROOT / "memrl" / "tasks" / "__init__.py").read_text()


def test_an_outside_agent_trains_and_is_evaluated_by_import_path(tiny_model_dir, questions,
                                                                  tmp_path):
    run = tmp_path / "train"
    done = memrl("train", str(EXAMPLES / "mem1" / "config.yaml"),
                 f"model.path={tiny_model_dir}", f"data.train_file={questions}",
                 f"trainer.out_dir={run}", "trainer.total_steps=2", "data.train_batch_size=2",
                 "rollout.n=2", "rl.ppo_mini_batch_size=2", "mem1.max_turn_tokens=8",
                 "trainer.log_sinks=[jsonl]")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in steps if "train/reward_mean" in m]
    assert [m["step"] for m in trained] == [1, 2]
    for m in trained:  # each named reward logged, and the task's own summary
        assert {"train/reward/em", "train/reward/early_stop", "train/accuracy",
                "train/turns"} <= m.keys()
        assert m["train/turns"] >= 1
    assert "mem1.task:Mem1Task" in (run / "config.yaml").read_text()

    out = tmp_path / "eval"
    done = memrl("eval", f"agent={TASK}", f"model.path={tiny_model_dir}",
                 f"eval.data={questions}", f"eval.out_dir={out}", "mem1.max_turn_tokens=8",
                 "rollout.temperature=0", "rl.reward={em: 1, early_stop: 0.5}", "rollout.n=2",
                 "eval.progress=false")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["agent"] == TASK and results["config"]["max_turn_tokens"] == 8
    assert results["results"]["n"] == 8 and 0 <= results["results"]["em"] <= 1
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["states"] for r in rows)
    for r in rows:  # the reward is the weighted sum of the named parts
        expected = r["scores"]["reward/em"] + 0.5 * r["scores"]["reward/early_stop"]
        assert r["reward"] == pytest.approx(expected)

    done = memrl("view", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "view.html").read_text()
    assert page.count('<section class="episode') == 8 and "data-kind=\"task\"" in page


def test_an_outside_agent_with_an_oracle_is_warm_started(tiny_model_dir, questions, tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text(f"agent: {TASK}\nmem1:\n  max_turn_tokens: 64\nsft:\n  batch_size: 2\n")
    run = tmp_path / "sft"
    done = memrl("sft", str(config), f"model.path={tiny_model_dir}",
                 f"data.train_file={questions}", f"data.val_file={questions}",
                 f"trainer.out_dir={run}", "trainer.total_steps=3", "trainer.log_sinks=[jsonl]",
                 "optim.lr=1e-3")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    nll = [m["val/nll"] for m in metrics if "val/nll" in m]
    assert len(nll) == 2 and nll[-1] < nll[0]  # it learns the oracle's replies
    assert [m["train/tokens"] > 0 for m in metrics if "train/nll" in m] == [True] * 3


def test_a_warm_start_without_an_oracle_is_one_line(tiny_model_dir, questions, tmp_path,
                                                    monkeypatch):
    # the plug-in's task without its oracle (every task memrl ships has one)
    (tmp_path / "noteacher.py").write_text(
        "from mem1.task import Mem1Task\n"
        "NoTeacher = type('NoTeacher', Mem1Task.__bases__, {\n"
        "    k: v for k, v in vars(Mem1Task).items() if k not in ('oracle', '__dict__')})\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    config = tmp_path / "sft.yaml"
    config.write_text("agent: noteacher:NoTeacher\n")
    done = memrl("sft", str(config), f"model.path={tiny_model_dir}",
                 f"data.train_file={questions}", f"trainer.out_dir={tmp_path / 'sft'}")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: agent: agent noteacher:NoTeacher has no oracle to warm-start from "
        "(Task.oracle); give data.trajectories, a trajectories file to imitate"], done.stderr


def test_a_bad_import_path_is_one_line(tmp_path, questions, tiny_model_dir):
    for agent, says in (("mem1.task:Nope", "has no class 'Nope'"),
                        ("nowhere.at.all:Task", "cannot import 'nowhere.at.all'"),
                        ("mem1.task:Mem1Details", "is not a memrl Task")):
        done = memrl("eval", f"agent={agent}", f"model.path={tiny_model_dir}",
                     f"eval.data={questions}", f"eval.out_dir={tmp_path / 'e'}")
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], done.stderr

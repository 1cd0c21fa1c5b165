"""A length curriculum (`data.curriculum`) and more validation sets (`data.val_sets`): the
stage of each step by hand, the config's checks, and a GRPO run on the tiny model (CPU) that
changes stage, validates at two lengths, and resumes in its stage."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TINY_MEMAGENT

from memrl.config import load_config
from memrl.data.biographies import make_biography_records
from memrl.data.hotpotqa import save_records_jsonl
from memrl.errors import MemrlInputError
from memrl.recipes import grpo
from memrl.recipes.config import DataConfig, TrainConfig
from memrl.run.metrics import read_metrics


def test_the_stage_of_each_step_by_hand():
    data = DataConfig(train_file="1x.jsonl", curriculum=[
        {"from_step": 3, "train_file": "4x.jsonl"}, {"from_step": 5, "train_file": "8x.jsonl"}])
    assert [data.stage_at(s) for s in range(1, 8)] == [0, 0, 1, 1, 2, 2, 2]
    assert [data.train_file_at(s) for s in (1, 2, 3, 4, 5, 9)] == [
        "1x.jsonl", "1x.jsonl", "4x.jsonl", "4x.jsonl", "8x.jsonl", "8x.jsonl"]
    assert DataConfig(train_file="a").train_file_at(100) == "a"


@pytest.mark.parametrize("overrides, message", [
    (["data.curriculum=[{from_step: 3, train_file: b}, {from_step: 2, train_file: c}]",
      "trainer.total_steps=4"], "increasing from_step"),
    (["data.curriculum=[{from_step: 1, train_file: b}]", "trainer.total_steps=4"],
     "greater than or equal to 2"),
    (["data.curriculum=[{from_step: 3, train_file: b}]"], "set trainer.total_steps"),
    (["data.curriculum=[{from_step: 9, train_file: b}]", "trainer.total_steps=4"],
     "after the last step"),
    (["data.val_sets={Long-1: v.jsonl}"], "lower case letters"),
    (["data.curriculum=[{from: 3, train_file: b}]", "trainer.total_steps=4"], "from"),
])
def test_bad_curricula_and_validation_sets_are_located_errors(overrides, message):
    with pytest.raises(MemrlInputError, match=message) as info:
        load_config(TrainConfig, None, ["model.path=m", "data.train_file=a", *overrides])
    assert "data." in str(info.value)


def write(records, path: Path) -> str:
    save_records_jsonl(records, path)
    return str(path)


def test_a_run_changes_stage_validates_long_and_resumes_in_its_stage(tiny_model_dir, tmp_path):
    """Steps 1-2 on 2 biographies a question, step 3 on the same questions over 4; validation
    at 2 (`val/`) and 4 (`val_long/`) at step 0 and at the end; a resumed run's next step
    (4) is in stage 1."""
    short = write(make_biography_records(6, 2, seed=0), tmp_path / "train_1x.jsonl")
    long = write(make_biography_records(6, 4, seed=0), tmp_path / "train_2x.jsonl")
    val = write(make_biography_records(2, 2, seed=0, split="eval"), tmp_path / "val.jsonl")
    val_long = write(make_biography_records(2, 4, seed=0, split="eval"), tmp_path / "vl.jsonl")
    out = tmp_path / "run"
    overrides = [f"model.path={tiny_model_dir}", f"data.train_file={short}",
                 f"data.curriculum=[{{from_step: 3, train_file: {long}}}]",
                 f"data.val_file={val}", f"data.val_sets={{long: {val_long}}}",
                 f"trainer.out_dir={out}", "trainer.total_steps=3", "trainer.log_sinks=[jsonl]",
                 "data.train_batch_size=2", "rollout.n=2", "rl.ppo_mini_batch_size=2",
                 *TINY_MEMAGENT]
    seen: list[grpo.Run] = []
    grpo.train(load_config(TrainConfig, None, overrides), on_start=seen.append)
    (run,) = seen
    assert run.stage == 1 and {r.num_docs for r in run.stream.records} == {4}
    rows = read_metrics(out / "metrics.jsonl")
    validated = [r for r in rows if "val/score" in r]
    assert [r["step"] for r in validated] == [0, 3]
    assert all("val_long/score" in r and "val_long/accuracy" in r for r in validated)
    samples = sorted(p.name for p in (out / "val_samples").iterdir())
    assert samples == ["step_000000.jsonl", "step_000000_long.jsonl", "step_000003.jsonl",
                       "step_000003_long.jsonl"]
    resumed = grpo.setup(load_config(TrainConfig, None, [*overrides, "trainer.resume=auto",
                                                         "trainer.total_steps=5"]))
    assert resumed.state.step == 3 and resumed.stage == 1
    assert {r.num_docs for r in resumed.stream.records} == {4}
    resumed.engine.close()

"""`memrl quickstart` end to end at a tiny size: every stage says what it does, and a
quickstart stopped in its GRPO stage continues where it stopped, to the same table as a run
that was never stopped (the quickstart's seam in the default test tier; the learning check
at full size is tests/test_quickstart_learning.py, pipeline tier)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from memrl.apps.quickstart import QuickstartPlan, run_quickstart

ROOT = Path(__file__).resolve().parents[1]
PLAN = QuickstartPlan(eval_docs=(2,), eval_questions=4, train_questions=16,
                      evaluate_before=False)


def quickstart(root: Path, *, fresh: bool = False) -> tuple[dict, str]:
    overrides = [f"model.path={root / 'model'}", f"data.train_file={root / 'data/train.jsonl'}",
                 f"data.val_file={root / 'data/val.jsonl'}", f"trainer.out_dir={root / 'rl'}",
                 "data.train_batch_size=2", "rl.ppo_mini_batch_size=2", "rollout.n=2",
                 "trainer.total_steps=2",
                 "trainer.save_freq=1", "trainer.test_freq=0", "trainer.val_before_train=false"]
    sft = ["trainer.total_steps=4", "trainer.save_freq=2", "trainer.console_every=2"]
    out = io.StringIO()
    summary = run_quickstart(ROOT / "configs/quickstart.yaml", overrides,
                             sft_config_path=ROOT / "configs/quickstart_sft.yaml",
                             sft_overrides=sft, fresh=fresh, plan=PLAN,
                             console=Console(file=out, width=200))
    return summary, out.getvalue()


@pytest.mark.slow
def test_a_stopped_quickstart_continues_to_the_same_table(tmp_path):
    summary, printed = quickstart(tmp_path)
    for stage in ("1/5", "2/5", "3/5", "4/5", "5/5"):
        assert stage in printed
    assert "step 2 │" in printed and "step 4 │" in printed  # the warm start's progress
    assert "N=2 episodes" in printed  # the evaluations' progress

    # Stopped in GRPO after its first checkpoint: the export and its evaluation not made.
    shutil.rmtree(tmp_path / "model_rl")
    shutil.rmtree(tmp_path / "eval_rl")
    *_, last = sorted((tmp_path / "rl" / "checkpoints").glob("step_*"))
    shutil.rmtree(last)
    again, printed = quickstart(tmp_path)
    assert "continuing the quickstart" in printed
    assert f"done before: {tmp_path / 'model_warm'}" in printed
    assert "at step 1" in printed  # GRPO resumed from its checkpoint
    assert again["table"] == summary["table"]

    _, printed = quickstart(tmp_path, fresh=True)
    assert "continuing" not in printed and "done before" not in printed

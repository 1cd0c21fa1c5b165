"""docs/architecture.md shows the training step on one screen: that copy is the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from memrl.recipes import grpo

ROOT = Path(__file__).resolve().parents[1]


def test_the_training_step_in_the_docs_is_the_code():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    shown = re.search(r"## The training step on one screen.*?```python\n(.*?)```", doc, re.S)
    assert shown is not None
    assert shown.group(1) == inspect.getsource(grpo.train_step)
    assert len(shown.group(1).splitlines()) <= 60  # one screen

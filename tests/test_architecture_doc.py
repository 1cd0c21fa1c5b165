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


def test_the_package_table_names_every_package_and_app():
    """docs/architecture.md's package table has a row for every package of memrl/ and every
    application of memrl.apps, and none for a package that is gone."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = re.search(r"## Packages\n\n(.*?)\n\n", doc, re.S)
    assert table is not None
    rows = set(re.findall(r"^\| `(memrl[\w.]*)` \|", table.group(1), re.M))
    package = ROOT / "memrl"
    wanted = {f"memrl.{d.name}" for d in package.iterdir() if (d / "__init__.py").is_file()}
    wanted |= {f"memrl.apps.{p.stem}" for p in (package / "apps").iterdir()
               if p.suffix == ".py" and p.stem != "__init__" or (p / "__init__.py").is_file()}
    assert sorted(wanted - rows) == []
    paths = {r: package.joinpath(*r.split(".")[1:]) for r in rows}
    assert sorted(r for r, p in paths.items()
                  if not (p.with_suffix(".py").is_file() or p.is_dir())) == []


def test_the_grpo_step_never_branches_on_a_critic():
    """PPO with a value model is its own step (`memrl.recipes.ppo`): GRPO's step and the
    helpers it calls never name a critic or a value, and the config picks the step."""
    from memrl.config import load_config
    from memrl.recipes import ppo
    from memrl.recipes.config import TrainConfig

    for helper in (grpo.train_step, grpo.with_logprobs, grpo.with_advantages,
                   grpo.rollout_batch):
        assert not re.search(r"critic|value|gae", inspect.getsource(helper)), helper.__name__
    base = ["model.path=m", "data.train_file=t.jsonl"]
    for estimator, step in [("grpo", grpo.train_step), ("rloo", grpo.train_step),
                            ("gae", ppo.train_step)]:
        config = load_config(TrainConfig, None, [*base, f"rl.adv_estimator={estimator}"])
        assert grpo.step_function(config) is step

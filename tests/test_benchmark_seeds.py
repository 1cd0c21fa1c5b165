"""benchmarks/seed_report.py: the seeds JSON and table from synthetic per-seed summaries
(written here in a temporary directory; no results file of the repository is touched)."""

from __future__ import annotations

import json

import pytest
from test_benchmarks_gpu import load_script


def summary(seed: int, bio: dict, hqa: dict, about: dict) -> dict:
    """A pipeline summary.json as `real_model_gpu.report` writes it (scores by N)."""
    return {
        "protocol": "memagent", "environment": {"gpu": f"card {seed}"},
        "plan": {"suites": {"biographies": {"train_docs": 24},
                            "ruler_hqa": {"train_docs": 20}}},
        "tables": {"biographies_published": {"scores": bio},
                   "ruler_hqa_published": {"scores": hqa},
                   "biographies_boxed": {"scores": {"rl": {"24": 99.0}}}},  # other protocol
        "memory": {"biographies_published": {"rl": {"1536": {"final_memory_about": about}}}},
    }


def test_seeds_json_and_table_from_per_seed_summaries(tmp_path):
    sr = load_script("seed_report")
    res = tmp_path / "out"
    seeds = {
        0: summary(0, {"warm_start": {"24": 60.0, "384": 40.0, "1536": 30.0},
                       "rl": {"24": 62.0, "384": 47.0, "1536": 36.0},
                       "base_memagent": {"24": 0.0}, "base_long_context": {"24": 1.0}},
                   {"warm_start": {"20": 30.0}, "rl": {"20": 34.0}},
                   {"asked": 120, "namesake": 5, "other": 3, "empty": 0}),
        1: summary(1, {"warm_start": {"24": 58.0, "384": 42.0, "1536": 34.0},
                       "rl": {"24": 64.0, "384": 44.0, "1536": None}},
                   {"warm_start": {"20": 32.0}, "rl": {"20": 33.0}},
                   {"asked": 110, "namesake": 10, "other": 8, "empty": 0}),
    }
    for s, data in seeds.items():
        (res / f"seed_{s}").mkdir(parents=True)
        (res / f"seed_{s}" / "summary.json").write_text(json.dumps(data))
    out = sr.write_seed_report(res, [0, 1, 2], tmp_path / "scaled.json")  # seed 2: not run
    assert json.loads((tmp_path / "scaled.json").read_text()) == out
    assert out["seeds"] == [0, 1] and out["protocol"] == "memagent"
    assert out["biographies"] == {
        "base_memagent": {"1": [0.0, None]},
        "warm_start": {"1": [60.0, 58.0], "16": [40.0, 42.0], "64": [30.0, 34.0]},
        "rl": {"1": [62.0, 64.0], "16": [47.0, 44.0], "64": [36.0, None]}}
    assert out["ruler_hqa"] == {"warm_start": {"1": [30.0, 32.0]}, "rl": {"1": [34.0, 33.0]}}
    assert out["memory"] == {"rl": {"64": {"asked": [120, 110], "namesake": [5, 10],
                                           "other": [3, 8], "empty": [0, 0]}}}
    assert out["environment"] == {"0": {"gpu": "card 0"}, "1": {"gpu": "card 1"}}
    assert sr.spread([1.0, None, 3.0]) == (2.0, 1.0, 3.0) and sr.spread([None]) is None

    table = (res / "seeds.md").read_text()
    assert "| row | 1x | 16x | 64x |" in table
    assert "| warm start, seed 0 | 60.0 | 40.0 | 30.0 |" in table
    assert "| **warm start, mean (min to max)** | 59.0 (58.0 to 60.0) | 41.0 (40.0 to 42.0) " \
           "| 32.0 (30.0 to 34.0) |" in table
    assert "| RL (GRPO), seed 1 | 64.0 | 44.0 | - |" in table
    assert "| **RL (GRPO), mean (min to max)** | 63.0 (62.0 to 64.0) | 45.5 (44.0 to 47.0) " \
           "| 36.0 (36.0 to 36.0, 1 seed) |" in table
    assert "| RL (GRPO) - warm start, seed 0 | +2.0 | +7.0 | +6.0 |" in table
    assert "| RL (GRPO) - warm start, seed 1 | +6.0 | +2.0 | - |" in table
    assert "| **RL (GRPO) - warm start, mean (min to max)** | +4.0 (+2.0 to +6.0) " in table
    assert "| base model as MemAgent, seed 1 | - |" in table
    assert "### ruler_hqa" in table and "| RL (GRPO), seed 0 | 34.0 |" in table


def test_seeds_of_different_protocols_or_none_are_refused(tmp_path):
    sr = load_script("seed_report")
    with pytest.raises(SystemExit, match="no seed_<s>/summary.json"):
        sr.write_seed_report(tmp_path, [0])
    a = summary(0, {"rl": {"24": 1.0}}, {}, {})
    with pytest.raises(SystemExit, match="different protocols"):
        sr.combine_seeds({0: a, 1: {**a, "protocol": "memagent-boxed"}})

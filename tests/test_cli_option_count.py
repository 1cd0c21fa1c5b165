"""The CLI's option count can only go down (issue 45: one command grammar, at most 60)."""

from memrl.cli import option_counts

MAX_OPTIONS = 26
"""After issue 45's command grammar (265 before it; target 60): every command takes
[CONFIG] [key.path=value ...], options only for paths, --resume and --fresh."""


def test_option_count_does_not_grow():
    counts = option_counts()
    assert "train" in counts and "prepare ruler-hqa" in counts  # every command is walked
    total = sum(counts.values())
    worst = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    assert total <= MAX_OPTIONS, f"{total} options (limit {MAX_OPTIONS}); most: {worst}"


def test_train_takes_config_overrides_and_paths_only():
    assert option_counts()["train"] <= 2  # --resume, --nproc-per-node


def test_eval_is_one_command_of_config_overrides_and_resume():
    counts = option_counts()
    assert counts["eval"] == 1 and not [c for c in counts if c.startswith("eval ")]

"""Issue 9: Ctrl-C / SIGTERM of `memrl train` and `memrl eval` on real processes.

Training stops with one line (the step, the last complete checkpoint, the command that
continues), exit 130 / 143, leaves only complete checkpoints, and `--resume` ends with the
metrics of an uninterrupted run.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import yaml

from memrl.cli import main as cli_main
from memrl.data.hotpotqa import save_records_jsonl
from memrl.data.synthetic import make_synthetic_records
from memrl.run.checkpoint import is_complete_checkpoint
from memrl.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("interrupt_data")
    save_records_jsonl(make_synthetic_records(16, num_docs=2, seed=0), d / "train.jsonl")
    save_records_jsonl(make_synthetic_records(2, num_docs=2, seed=1), d / "val.jsonl")
    return d


def write_config(path: Path, model_dir: Path, data_dir: Path, out_dir: Path, **trainer) -> Path:
    cfg = {
        "seed": 5,
        "model": {"path": str(model_dir)},
        "data": {"train_file": str(data_dir / "train.jsonl"), "train_batch_size": 2},
        "memagent": {"chunk_size": 48, "max_chunks": 2, "max_memory_tokens": 6,
                     "max_final_tokens": 6},
        "rollout": {"n": 2, "temperature": 1.0, "top_p": 1.0},
        "rl": {"ppo_mini_batch_size": 1, "overlong": "keep",
               "dynamic_sampling": False},
        "optim": {"lr": 1e-2, "warmup_steps": 1},
        "trainer": {"out_dir": str(out_dir), "log_sinks": ["jsonl"], **trainer},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def latest_step(out_dir: Path) -> int:
    """The step of `checkpoints/latest`, 0 if there is none yet."""
    latest = out_dir / "checkpoints" / "latest"
    try:
        name = latest.read_text().strip()
    except OSError:
        return 0
    return int(name.removeprefix("step_")) if name.startswith("step_") else 0


def interrupt_after_checkpoint(cfg: Path, out_dir: Path, sig: int, after: int, *extra: str
                               ) -> tuple[int, str]:
    """Run `memrl train CFG` in a subprocess; send `sig` once a checkpoint past step `after`
    exists. Returns (exit code, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memrl", "train", cfg.name, *extra], cwd=cfg.parent, env=env,
        text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and latest_step(out_dir) <= after:
            time.sleep(0.02)
        assert proc.poll() is None, "training ended before it could be interrupted"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def assert_only_complete_checkpoints(out_dir: Path) -> None:
    """Nothing partial: no temp leftovers, every step_* directory complete."""
    entries = list((out_dir / "checkpoints").iterdir())
    assert not [p for p in entries if p.name.startswith(".tmp-")], entries
    for p in entries:
        if p.name.startswith("step_"):
            assert is_complete_checkpoint(p), p


def comparable(rows):
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")}
            for r in rows]


MESSAGE = re.compile(
    r"interrupted \((?P<sig>SIG\w+)\) in step (?P<step>\d+) of 5 of the training run in "
    r"(?P<out>\S+); last complete checkpoint: (?P<ckpt>\S+); "
    r"continue with: memrl train kill\.yaml --resume$"
)


@pytest.mark.pipeline
@pytest.mark.slow
def test_sigint_and_sigterm_then_resume_match_an_uninterrupted_run(
    tiny_model_dir, data_dir, tmp_path
):
    total = 5
    ref = write_config(tmp_path / "ref.yaml", tiny_model_dir, data_dir, tmp_path / "ref",
                       total_steps=total, save_freq=1)
    assert cli_main(["train", str(ref)]) == 0

    out = tmp_path / "kill"
    cfg = write_config(tmp_path / "kill.yaml", tiny_model_dir, data_dir, out,
                       total_steps=total, save_freq=1)
    resumed_from = 0
    for sig, code, extra in [(signal.SIGINT, 130, []), (signal.SIGTERM, 143, ["--resume"])]:
        rc, err = interrupt_after_checkpoint(cfg, out, sig, resumed_from, *extra)
        assert rc == code, err
        lines = err.splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        m = MESSAGE.match(lines[0])
        assert m, lines[0]
        assert m["sig"] == signal.Signals(sig).name and m["out"] == str(out)
        assert_only_complete_checkpoints(out)
        saved = latest_step(out)
        assert m["ckpt"] == str(out / "checkpoints" / f"step_{saved:08d}")
        assert resumed_from < saved < total and int(m["step"]) >= saved
        resumed_from = saved

    assert cli_main(["train", str(cfg), "--resume"]) == 0
    ref_rows = comparable(read_metrics(tmp_path / "ref" / "metrics.jsonl"))
    got_rows = comparable(read_metrics(out / "metrics.jsonl"))
    assert [r["step"] for r in got_rows] == list(range(1, total + 1))
    assert [r["step"] for r in got_rows] == [r["step"] for r in ref_rows]
    for a, b in zip(ref_rows, got_rows, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12), (a["step"], k)


EVAL_CHILD = textwrap.dedent(
    """
    import sys, time
    from memrl.cli import main
    import memrl.eval.benchmark

    def slow(*args, **kwargs):
        print("ready", flush=True)
        time.sleep(60)

    memrl.eval.benchmark.evaluate_suite = slow
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "sig", "code"),
    [("ruler-hqa", signal.SIGINT, 130), ("locomo", signal.SIGTERM, 143)],
)
def test_eval_interrupted_names_the_output_dir(tiny_model_dir, tmp_path, command, sig, code):
    """`command`: the benchmark evaluated (its agent: memagent / memupdate)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval_2.json").write_text("[]")
    (data / "episodes.jsonl").write_text("")
    out = tmp_path / "eval"
    agent = "memagent" if command == "ruler-hqa" else "memupdate"
    args = ["eval", f"agent={agent}", f"model.path={tiny_model_dir}",
            f"eval.benchmarks=[{command}={data}]", f"eval.out_dir={out}",
            "eval.progress=false", "model.device=cpu"]
    if command == "ruler-hqa":
        args += ["eval.num_docs=[2]"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", EVAL_CHILD, *args], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code
    assert err.splitlines() == [
        f"interrupted ({signal.Signals(sig).name}) while evaluating into {out}; finished "
        "episodes are kept there; run the same command again to continue"
    ]


def test_a_training_step_raises_no_user_warning(tiny_model_dir, data_dir, tmp_path):
    """Nothing warns on every step (e.g. float() of a tensor that requires grad)."""
    cfg = write_config(tmp_path / "w.yaml", tiny_model_dir, data_dir, tmp_path / "w",
                       total_steps=1, test_freq=1)
    data = yaml.safe_load(cfg.read_text())
    data["data"]["val_file"] = str(data_dir / "val.jsonl")
    data["rl"].update(use_kl_loss=True, use_kl_in_reward=True, kl_reward_coef=0.01)
    cfg.write_text(yaml.safe_dump(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert cli_main(["train", str(cfg)]) == 0
    assert [r["step"] for r in read_metrics(tmp_path / "w" / "metrics.jsonl")] == [0, 1]

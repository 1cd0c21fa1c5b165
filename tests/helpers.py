"""Helpers shared by test modules (import as `from helpers import ...`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


TINY_MEMAGENT = [
    "memagent.chunk_size=48",
    "memagent.max_chunks=2",
    "memagent.max_memory_tokens=6",
    "memagent.max_final_tokens=6",
    "memagent.temperature=1.0",
    "memagent.top_p=1.0",
    "rl.overlong=keep",
]
"""Overrides that make MemAgent episodes on the tiny model short: two 48-token chunks, 6-token
memories and answers, plain sampling, truncated turns trained."""


def kill_at_first_checkpoint(
    cmd: Sequence[str], env: Mapping[str, str], run_dir: Path, *, timeout: float = 240
) -> int:
    """Start `cmd` (a training command writing `run_dir/checkpoints`), SIGKILL it as soon as
    `checkpoints/latest` names a checkpoint, and return that checkpoint's step."""
    proc = subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    latest = Path(run_dir) / "checkpoints" / "latest"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip():
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = latest.parent / latest.read_text().strip() / "trainer_state.json"
    return json.loads(state.read_text())["step"]

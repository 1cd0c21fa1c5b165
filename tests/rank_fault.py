"""`memrl <args>` (the CLI) with a fault injected into one rank, for the rank-failure tests.

    torchrun --standalone --nproc-per-node 2 tests/rank_fault.py train CONFIG ...
    MEMRL_TEST_FAULT=stop:1:2    rank 1 stops itself (SIGSTOP) as it starts the rollout of step 2
    MEMRL_TEST_FAULT=kill:0:3    rank 0 kills itself (SIGKILL) there
    MEMRL_TEST_FAULT=sleep:1:2   rank 1 sleeps there for 30 s (alive, beating, but late)
    MEMRL_TEST_FAULT=raise:1:2   rank 1 raises there

The task rolls out question by question (`dist_train.PerQuestionTask`), so one process and two
ranks train alike and a resumed run can be compared with an uninterrupted one. Before the
signal the rank writes `<pid> <time>` to MEMRL_TEST_FAULT_FILE and waits a second, so that
its heartbeat has published what it is doing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import dist_train

from memrl.distributed import heartbeat
from memrl.cli import main
from memrl.recipes import grpo

FAULT = os.environ.get("MEMRL_TEST_FAULT", "")


class FaultyTask(dist_train.PerQuestionTask):
    def rollout(self, engine, records, spec):
        if FAULT:
            kind, rank, step = FAULT.split(":")
            if heartbeat.activity() == ("rollout", int(step)) and os.environ["RANK"] == rank:
                time.sleep(1.0)
                Path(os.environ["MEMRL_TEST_FAULT_FILE"]).write_text(
                    f"{os.getpid()} {time.time()}\n")
                if kind == "sleep":
                    time.sleep(30)
                elif kind == "raise":
                    raise RuntimeError("injected failure")
                else:
                    os.kill(os.getpid(), signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
        return super().rollout(engine, records, spec)


_build_task = grpo.build_task
grpo.build_task = lambda config: FaultyTask(_build_task(config))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

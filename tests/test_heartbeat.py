"""The rank heartbeat's pieces (memrl.distributed.heartbeat), on an in-process store with a
hand-driven clock; the resume command of each launcher; the signal hook. The real thing, under
torchrun with a frozen and a killed rank, is tests/test_rank_failures.py."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as tdist

from memrl.recipes.launch import resume_command
from memrl.distributed import NPROC_ENV, collective_failed, heartbeat
from memrl.distributed.heartbeat import Beat, Heartbeat, Lost, Verdict, doing, process_state
from memrl.interrupt import Interrupted, exit_on_signals

TIMEOUT = 10.0
HOST = socket.gethostname()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pair(clock: Clock, world_size: int = 2, **kw) -> list[Heartbeat]:
    store = tdist.HashStore()
    return [Heartbeat(store, r, world_size, TIMEOUT, clock=clock, host=f"h{r}", pid=1000 + r,
                      **kw) for r in range(world_size)]


def advance(clock: Clock, beats: list[Heartbeat], seconds: float, beating: list[int]) -> None:
    """Let `seconds` pass in steps of one interval; the ranks in `beating` beat and check."""
    for _ in range(round(seconds / beats[0].interval_s)):
        clock.now += beats[0].interval_s
        for r in beating:
            beats[r].beat()
            beats[r].check()


def test_a_frozen_peer_is_lost_after_the_timeout_and_not_before():
    clock = Clock()
    a, b = pair(clock)
    heartbeat.note("rollout", 3)
    b.beat()
    assert a.check() == [] and a.bound_s == pytest.approx(1.2 * TIMEOUT)
    advance(clock, [a, b], TIMEOUT - a.interval_s, beating=[0])  # b froze
    assert a.check() == []
    advance(clock, [a, b], 2 * a.interval_s, beating=[0])
    (lost,) = a.check()
    assert (lost.rank, lost.kind, lost.beat.phase, lost.beat.step) == (1, "frozen", "rollout", 3)
    assert lost.describe() == ("rank 1 (host h1, pid 1001) stopped answering in step 3 "
                               "(rollout): no heartbeat for 11 s (frozen, or its machine is "
                               "unreachable)")
    heartbeat.note("setup")


def test_a_beating_peer_is_never_lost():
    clock = Clock()
    a, b = pair(clock)
    advance(clock, [a, b], 5 * TIMEOUT, beating=[0, 1])
    assert a.check() == [] and b.check() == []


def test_a_peer_never_heard_from_is_lost_after_the_timeout():
    clock = Clock()
    a, _ = pair(clock)
    advance(clock, [a], TIMEOUT + 2 * a.interval_s, beating=[0])
    (lost,) = a.check()
    assert lost.beat is None and lost.describe().startswith("rank 1 sent no heartbeat for 12 s")


def test_a_rank_that_was_frozen_itself_judges_nobody_on_that_gap():
    clock = Clock()
    a, b = pair(clock)
    b.beat()
    a.check()
    clock.now += 10 * TIMEOUT  # a did not run; b's beats since then are unseen
    assert a.check() == []
    advance(clock, [a, b], TIMEOUT + 2 * a.interval_s, beating=[0])
    assert [x.rank for x in a.check()] == [1]


def test_failed_peers_are_lost_at_once_and_finished_ones_never():
    clock = Clock()
    a, b, c = pair(clock, world_size=3)
    heartbeat.note("update", 2)
    b.set_state("failed: ValueError: bad batch")
    c.set_state("interrupted")
    heartbeat.note("setup")
    (lost,) = a.check()
    assert lost.describe() == (
        "rank 1 (host h1, pid 1001) failed in step 2 (update): ValueError: bad batch")
    b.state = "done"  # (a new state is only taken while running; set it for the next case)
    b.beat()
    advance(clock, [a, b, c], 3 * TIMEOUT, beating=[0])
    assert a.check() == []


def test_a_peer_of_this_host_whose_process_is_gone_is_dead_at_once():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    store = tdist.HashStore()
    clock = Clock()
    a = Heartbeat(store, 0, 2, TIMEOUT, clock=clock)
    b = Heartbeat(store, 1, 2, TIMEOUT, clock=clock, host=HOST, pid=child.pid)
    b.beat()
    if process_state(child.pid) is None:
        pytest.skip("no /proc to tell whether a process lives")
    (lost,) = a.check()
    assert lost.kind == "dead" and lost.describe().startswith(
        f"rank 1 (host {HOST}, pid {child.pid}) died in setup: its process is gone")
    # The same pid on another machine is nothing to go by: only the timeout judges it.
    c = Heartbeat(tdist.HashStore(), 0, 2, TIMEOUT, clock=clock)
    Heartbeat(c.store, 1, 2, TIMEOUT, clock=clock, host="elsewhere", pid=child.pid).beat()
    assert c.check() == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_process_state_tells_running_stopped_and_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_state(child.pid) == "running"
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(child.pid) != "stopped" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_state(child.pid) == "stopped"
        assert process_state(child.pid, started="1") == "gone"  # a reused pid
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) == "gone"


def test_every_rank_reports_the_first_verdict_and_only_the_lowest_survivor_prints():
    clock = Clock()
    a, b, c = pair(clock, world_size=3)
    b.beat()
    c.beat()
    lost_by_b = [Lost(0, "frozen", None, 12.0)]
    first = b.decide(lost_by_b)
    assert (first.lost, first.reporter) == ([0], 1)
    later = c.decide([Lost(2, "dead", Beat(2, "h2", 1002, 1))])  # c's own view comes too late
    assert later == first == c.stored_verdict()
    text = ("error: rank 0 sent no heartbeat for 12 s since this rank started watching (it "
            "never started, froze, or its machine is unreachable); the run is stopped")
    out_b, out_c = io.StringIO(), io.StringIO()
    assert b.report(first, stream=out_b) and c.report(first, stream=out_c)
    assert out_b.getvalue() == text + "\n" and out_c.getvalue() == ""  # rank 1 speaks
    assert not b.report(first, stream=out_b)  # once per process
    heartbeat.set_epilogue(lambda: "continue with: memrl train c.yaml --resume")
    try:
        out = io.StringIO()
        Heartbeat(b.store, 1, 3, TIMEOUT, clock=clock, host="h1").report(first, stream=out)
    finally:
        heartbeat.set_epilogue(None)
    assert out.getvalue() == text + "; continue with: memrl train c.yaml --resume\n"


def test_verdict_waits_for_a_peer_to_go_stale():
    store = tdist.HashStore()  # a real clock: `verdict` sleeps between checks
    a = Heartbeat(store, 0, 2, 0.3, host="h0", pid=1000)
    Heartbeat(store, 1, 2, 0.3, host="h1", pid=1001).beat()
    assert a.verdict() is None
    found = a.verdict(wait_s=2.0)
    assert found is not None and found.lost == [1] and found.reporter == 0


def test_a_stuck_collective_names_where_every_rank_is():
    clock = Clock()
    a, b = pair(clock)
    heartbeat.note("rollout", 4)
    b.beat()
    heartbeat.note("update", 4)
    with heartbeat.collective():
        a.beat()
    assert b.check() == [] and b.beats[0].doing() == (
        "in step 4 (update; waiting for the other ranks)")
    a.check()
    error = RuntimeError("[/src/gloo/unbound_buffer.cc:78] Timed out waiting 1800000ms for recv")
    verdict = a.stuck(error, 1800)
    heartbeat.note("setup")
    assert verdict.reporter == 0 and verdict.lost == []
    assert verdict.text == (
        "a collective failed (Timed out waiting 1800000ms for recv) though every rank is alive: "
        "rank 0 (host h0, pid 1000) in step 4 (update; waiting for the other ranks), rank 1 "
        "(host h1, pid 1001) in step 4 (rollout); a rank that is not waiting is stuck, or slower "
        "than trainer.dist_timeout_s (1800 s) allows")
    assert b.stored_verdict() == verdict


def test_beats_and_verdicts_survive_the_store():
    beat = Beat(3, "node-7", 42, 9, "update", 5, "running", "12345")
    assert Beat.decode(beat.encode().encode()) == beat
    verdict = Verdict.of([Lost(1, "frozen", beat, 70.0)], 4)
    assert Verdict.decode(verdict.encode()) == verdict
    assert verdict.reporter == 0 and verdict.stopped == [["node-7", 42]]
    assert doing("setup", None) == "in setup" and doing("rollout", 2) == "in step 2 (rollout)"


def test_the_resume_command_keeps_the_launcher_and_the_number_of_ranks():
    cfg, extra = Path("c.yaml"), ["rollout.n=4", "trainer.out_dir=my run"]
    assert resume_command(cfg, extra, env={}) == (
        "memrl train c.yaml rollout.n=4 'trainer.out_dir=my run' --resume")
    assert resume_command(cfg, [], env={NPROC_ENV: "2", "WORLD_SIZE": "2"}) == (
        "memrl train c.yaml --nproc-per-node 2 --resume")
    torchrun = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "1"}
    assert resume_command(cfg, [], env=torchrun) == (
        "torchrun --standalone --nproc-per-node=4 -m memrl train c.yaml --resume")
    assert resume_command(cfg, [], "sft", env=torchrun) == (
        "torchrun --standalone --nproc-per-node=4 -m memrl sft c.yaml --resume")
    nodes = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2"}
    assert resume_command(cfg, [], env=nodes) == (
        "torchrun --nnodes=2 --nproc-per-node=8 -m memrl train c.yaml --resume (on every "
        "node, with this run's rendezvous options)")


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_the_signal_hook_can_replace_the_interrupt_message():
    out = io.StringIO()
    with pytest.raises(Interrupted) as info:
        with exit_on_signals("here", "go on", stream=out, on_signal=lambda s: 1):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert info.value.code == 1 and out.getvalue() == ""
    with pytest.raises(Interrupted) as info:
        with exit_on_signals("here", "go on", stream=out, on_signal=lambda s: None):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert info.value.code == 143 and out.getvalue() == "interrupted (SIGTERM) here; go on\n"


def test_collective_errors_are_told_apart_from_bugs():
    assert collective_failed(RuntimeError(
        "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"))
    assert collective_failed(RuntimeError("Timed out waiting 5000ms for recv operation"))
    assert collective_failed(tdist.DistBackendError("NCCL watchdog timeout"))
    assert not collective_failed(RuntimeError("shape mismatch"))
    assert not collective_failed(ValueError("Timed out waiting for the user"))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_failed_peer_of_this_host_is_lost_once_it_exited_or_after_the_timeout():
    clock = Clock()
    store = tdist.HashStore()
    a = Heartbeat(store, 0, 2, TIMEOUT, clock=clock, host=HOST, pid=1000)
    b = Heartbeat(store, 1, 2, TIMEOUT, clock=clock, host=HOST, pid=os.getpid())  # running
    b.set_state("failed: ValueError: x")
    assert a.check() == []  # still printing its traceback: let it exit first
    advance(clock, [a, b], TIMEOUT + 2 * a.interval_s, beating=[0, 1])
    assert [x.kind for x in a.check()] == ["failed"]


SIGTERM_IN_A_STORE_CALL = """
import os, signal, subprocess, sys
import torch.distributed as tdist
from memrl.distributed.heartbeat import Beat, Heartbeat
from memrl.interrupt import Interrupted, exit_on_signals

class Store:  # torchrun's SIGTERM arrives while the main thread is in a store call
    def __init__(self):
        self.inner, self.sent = tdist.HashStore(), False
    def set(self, *a): return self.inner.set(*a)
    def get(self, *a): return self.inner.get(*a)
    def compare_set(self, *a): return self.inner.compare_set(*a)
    def check(self, keys):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return self.inner.check(keys)

child = subprocess.Popen([sys.executable, "-c", "pass"])
child.wait()  # rank 1's process is gone
beat = Heartbeat(Store(), 0, 2, 60.0)
beat.store.set(f"{beat.prefix}/1", Beat(1, beat.host, child.pid, 1).encode())

def on_signal(signum):
    found = beat.verdict()
    return 1 if found is not None and beat.report(found) else None

try:
    with exit_on_signals("here", "go on", on_signal=on_signal):
        beat.verdict()  # the main thread, after a failed collective
except Interrupted as exc:
    sys.exit(exc.code)
"""


def test_a_sigterm_during_a_store_call_of_the_main_thread_still_reports_the_lost_peer():
    # torchrun's SIGTERM ran the handler inside the main thread's `with lock:` around a store
    # call; the handler's own verdict then waited on that lock forever (and so did the
    # heartbeat's thread): no line, and torchrun's SIGKILL 30 s later.
    proc = subprocess.run([sys.executable, "-c", SIGTERM_IN_A_STORE_CALL], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: rank 1 (host {HOST}, pid "), proc.stderr
    assert " died in setup: its process is gone" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr

"""Whether the other ranks are alive: a heartbeat per rank, watched by every rank.

Without it, a run on several processes learns that a rank froze only when a collective has
waited `trainer.dist_timeout_s`, and that a rank died only from the launcher's SIGTERM, which
the survivors took for an interruption. With it, each rank of a torchrun run, once it has
joined the process group, runs a `Heartbeat`: a daemon thread that every `timeout_s / 10`
seconds

- writes this rank's `Beat` (a counter; host and pid; what the rank is doing, `note(phase,
  step)`, which the recipe calls; how it is: running / done / interrupted / failed: <error>)
  into the launcher's key-value store: torchrun's TCPStore at MASTER_ADDR:MASTER_PORT, served
  by torchrun's agent rather than by a rank, so it answers whichever rank froze;
- reads the other ranks' beats. A peer is *lost* when its counter has not moved for
  `timeout_s` on this rank's clock (frozen: SIGSTOP, a machine or link that stopped
  answering), when it runs on this host and its process is gone (SIGKILL, the kernel's
  out-of-memory killer), or when its beat says it failed (it raised, and said so on its way
  out; on this host, once its process has exited).

Detection bound: a frozen peer is found between 0.9 × and 1.2 × `timeout_s` after it stopped
(its last beat may be up to one interval older than when it was first seen, and the check
runs once an interval); a dead peer on the same host as soon as the launcher's SIGTERM
arrives, or at the next check. A rank whose own thread did not run for half the timeout (it
was frozen itself) judges nobody on that gap. If the store stops answering, nobody is judged
(the collective timeout still applies).

The first rank to find a lost peer stores a `Verdict` (compare-and-set, so every rank reports
the same one). The lowest-numbered rank that is not lost prints it as one line,
`error: rank 1 (host node-3, pid 4242) stopped answering in step 3 (rollout): ...; <how to
continue>`; the others exit without a word. A rank whose main thread is blocked in a
collective cannot unwind, so the watching thread ends the process itself (`os._exit(1)`),
after killing a stopped peer on its own host: the launcher would otherwise wait 30 s for it,
since a stopped process cannot handle SIGTERM. Exiting at any moment is safe: checkpoints
are written atomically, and a resume drops the metrics logged after the last checkpoint.

Process-wide, like the process group it watches: `start` / `stop` / `current`, and `note`,
which costs an assignment when no heartbeat runs.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memrl.interrupt import print_line

__all__ = [
    "EXIT_PEER_LOST", "Beat", "Heartbeat", "Lost", "Verdict", "activity", "collective",
    "current", "doing", "note", "process_state", "set_epilogue", "start", "stop",
]

KEY_PREFIX = "memrl/heartbeat"
BEATS_PER_TIMEOUT = 10
"""Beats (and checks) per `timeout_s`: the interval is a tenth of the timeout."""
EXIT_PEER_LOST = 1
"""Exit code of a rank that stops because a peer was lost."""
FINAL_STATES = ("done", "interrupted")
"""States of a rank that left on purpose: never lost."""


# ----------------------------------------------------------------- what this rank is doing

_activity: tuple[str, int | None] = ("setup", None)


def note(phase: str, step: int | None = None) -> None:
    """Record what this rank is doing (`rollout` of step 3); a running heartbeat publishes it
    at once. Step None: a phase outside the steps (setup, validation before training)."""
    global _activity
    _activity = (phase, step)
    if _current is not None:
        _current.poke()


def activity() -> tuple[str, int | None]:
    """The (phase, step) last given to `note`."""
    return _activity


_collectives = 0


@contextmanager
def collective() -> Iterator[None]:
    """Around a collective (`memrl.distributed.Dist` wraps its own): the beats sent meanwhile
    say that this rank waits for the others, which tells a stuck rank from the ones waiting."""
    global _collectives
    _collectives += 1
    try:
        yield
    finally:
        _collectives -= 1


def doing(phase: str, step: int | None, waiting: bool = False) -> str:
    """`in step 3 (rollout)`, or `in setup` for a phase outside the steps; `waiting`: `in
    step 3 (rollout; waiting for the other ranks)`."""
    wait = "; waiting for the other ranks" if waiting else ""
    return f"in step {step} ({phase}{wait})" if step is not None else f"in {phase}{wait}"


# ------------------------------------------------------------------ beats and their verdict


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat, as stored."""

    rank: int
    host: str
    pid: int
    seq: int
    phase: str = "setup"
    step: int | None = None
    state: str = "running"
    """running, done, interrupted, or `failed: <error>`."""
    started: str | None = None
    """The process's start time (/proc), so that a reused pid is not taken for it."""
    waiting: bool = False
    """In a collective, waiting for the other ranks."""

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, raw: bytes | str) -> Beat:
        return cls(**json.loads(raw))

    def who(self) -> str:
        return f"rank {self.rank} (host {self.host}, pid {self.pid})"

    def doing(self) -> str:
        return doing(self.phase, self.step, self.waiting)


@dataclass(frozen=True)
class Lost:
    """A peer found lost: `frozen` (no beat for `age_s`), `dead` (its process is gone) or
    `failed` (its beat says so)."""

    rank: int
    kind: str
    beat: Beat | None
    age_s: float = 0.0

    def describe(self) -> str:
        if self.beat is None:
            return (f"rank {self.rank} sent no heartbeat for {self.age_s:.0f} s since this rank "
                    "started watching (it never started, froze, or its machine is unreachable)")
        who, where = self.beat.who(), self.beat.doing()
        if self.kind == "dead":
            return (f"{who} died {where}: its process is gone (killed, e.g. by SIGKILL or the "
                    "out-of-memory killer)")
        if self.kind == "failed":
            return f"{who} failed {where}: {self.beat.state.removeprefix('failed: ')}"
        return (f"{who} stopped answering {where}: no heartbeat for {self.age_s:.0f} s (frozen, "
                "or its machine is unreachable)")


@dataclass(frozen=True)
class Verdict:
    """What every rank reports about the lost ranks, and which rank says it."""

    text: str
    lost: list[int]
    reporter: int
    stopped: list[list[Any]]
    """[host, pid] of lost ranks found stopped (SIGSTOP): a survivor on that host kills them."""

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, raw: bytes | str) -> Verdict:
        return cls(**json.loads(raw))

    @classmethod
    def of(cls, lost: list[Lost], world_size: int) -> Verdict:
        ranks = sorted({x.rank for x in lost})
        reporter = min((r for r in range(world_size) if r not in ranks), default=0)
        stopped = [[x.beat.host, x.beat.pid] for x in lost
                   if x.kind == "frozen" and x.beat is not None]
        text = "; ".join(x.describe() for x in sorted(lost, key=lambda x: x.rank))
        return cls(text, ranks, reporter, stopped)


def process_state(pid: int, started: str | None = None) -> str | None:
    """`gone`, `stopped` or `running` for a process of this machine (from /proc); None where
    /proc cannot tell. A pid now used by a process started at another time is `gone`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone" if Path("/proc/self/stat").exists() else None
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 20:
        return None
    state, start = fields[0], fields[19]
    if (started is not None and start != started) or state in ("Z", "X", "x"):
        return "gone"
    return "stopped" if state in ("T", "t") else "running"


def _own_start_time() -> str | None:
    try:
        return Path("/proc/self/stat").read_text().rsplit(")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return None


# -------------------------------------------------------------------------- the heartbeat


class Heartbeat:
    """This rank's beat in `store`, and its watch over the other `world_size - 1` ranks.

    `store` is a torch.distributed Store (a TCPStore client of the launcher's store; a
    HashStore in tests); `clock` a monotonic clock in seconds. `start()` runs the beat and
    the watch in a daemon thread; `beat()`, `check()` and `verdict()` are the steps it takes,
    callable on their own.
    """

    def __init__(
        self, store: Any, rank: int, world_size: int, timeout_s: float, *,
        clock: Callable[[], float] = time.monotonic, host: str | None = None,
        pid: int | None = None, prefix: str = KEY_PREFIX,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s = float(timeout_s)
        self.interval_s = self.timeout_s / BEATS_PER_TIMEOUT
        self.clock = clock
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.started = _own_start_time() if pid is None else None
        self.prefix = prefix
        self.state = "running"
        self.beats: dict[int, Beat] = {}
        """The last beat read of every peer."""
        self._seq = 0
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (seq, when it last moved)
        self._failed: dict[int, float] = {}  # rank -> when its beat first said it failed
        self._since = clock()  # when watching began: the age of a peer never heard from
        self._last_check: float | None = None
        # One store operation at a time (thread and main). Reentrant: torchrun's SIGTERM can
        # land while the main thread holds it (its handler runs between two bytecodes of a
        # `with self._lock` block, e.g. in `verdict` after a failed collective) and the
        # handler asks for the verdict too: a plain lock deadlocked both the main thread and
        # this heartbeat's thread, and the survivor died silently by torchrun's SIGKILL.
        self._lock = threading.RLock()
        self._ended = threading.Lock()  # taken by the one path that ends the process
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def bound_s(self) -> float:
        """The longest a frozen peer can go unnoticed: 1.2 × timeout_s."""
        return self.timeout_s + 2 * self.interval_s

    def _key(self, rank: int) -> str:
        return f"{self.prefix}/{rank}"

    # ---- the steps
    def beat(self) -> None:
        """Write this rank's beat (a new counter value, its activity and state)."""
        phase, step = activity()
        with self._lock:
            self._seq += 1
            beat = Beat(self.rank, self.host, self.pid, self._seq, phase, step, self.state,
                        self.started, _collectives > 0)
            self.store.set(self._key(self.rank), beat.encode())

    def check(self) -> list[Lost]:
        """Read the peers' beats; the peers that are lost now."""
        now = self.clock()
        if self._last_check is not None and now - self._last_check > self.timeout_s / 2:
            # This rank did not run (frozen itself, or starved): nobody is judged on that gap.
            self._seen = {r: (seq, now) for r, (seq, _) in self._seen.items()}
            self._since = now
        self._last_check = now
        lost = []
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            beat = self._read(rank)
            if beat is not None:
                self.beats[rank] = beat
                if self._seen.get(rank, (None,))[0] != beat.seq:
                    self._seen[rank] = (beat.seq, now)
                if beat.state in FINAL_STATES:
                    continue
                if beat.state.startswith("failed"):
                    # On this host, let it exit first (up to the timeout), so that the
                    # launcher's report names it as the first failure, not the reporter.
                    since = self._failed.setdefault(rank, now)
                    alive = (beat.host == self.host
                             and process_state(beat.pid, beat.started) == "running")
                    if not alive or now - since > self.timeout_s:
                        lost.append(Lost(rank, "failed", beat))
                    continue
                if beat.host == self.host and process_state(beat.pid, beat.started) == "gone":
                    lost.append(Lost(rank, "dead", beat))
                    continue
            age = now - self._seen.get(rank, (None, self._since))[1]
            if age > self.timeout_s:
                lost.append(Lost(rank, "frozen", beat, age))
        return lost

    def _read(self, rank: int) -> Beat | None:
        key = self._key(rank)
        with self._lock:
            if not self.store.check([key]):
                return None
            return Beat.decode(self.store.get(key))

    def stored_verdict(self) -> Verdict | None:
        """The verdict some rank stored, if any."""
        key = f"{self.prefix}/verdict"
        with self._lock:
            if not self.store.check([key]):
                return None
            return Verdict.decode(self.store.get(key))

    def decide(self, lost: list[Lost]) -> Verdict:
        """Store the verdict on `lost` unless a rank stored one first; the one stored."""
        mine = Verdict.of(lost, self.world_size)
        with self._lock:
            stored = self.store.compare_set(f"{self.prefix}/verdict", "", mine.encode())
        return Verdict.decode(stored)

    def verdict(self, wait_s: float = 0.0) -> Verdict | None:
        """The stored verdict, or one on the peers lost now; waiting up to `wait_s` for one
        (a peer that dies mid-collective on another machine goes stale only after the
        timeout). None: every peer is alive, or the store does not answer."""
        deadline = self.clock() + wait_s
        while True:
            try:
                found = self.stored_verdict()
                if found is None and (lost := self.check()):
                    found = self.decide(lost)
            except Exception:  # noqa: BLE001 - the store did not answer: judge nobody
                found = None
            if found is not None or self.clock() >= deadline:
                return found
            time.sleep(max(0.0, min(self.interval_s, deadline - self.clock())))

    def stuck(self, exc: BaseException, dist_timeout_s: float) -> Verdict:
        """The verdict on a collective that failed though no rank is lost: where every rank
        is (one that is elsewhere is stuck, or slower than the timeout allows). Stored like
        any verdict: this rank reports it unless another rank stored one first."""
        import re

        phase, step = activity()  # this rank's collective has ended: it was waiting
        where = {self.rank: f"rank {self.rank} (host {self.host}, pid {self.pid}) "
                            f"{doing(phase, step, waiting=True)}"}
        where.update({r: f"{b.who()} {b.doing()}" for r, b in self.beats.items()})
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        error = re.sub(r"^\[[^\]]*\]\s*", "", lines[0])[:200]  # gloo's source location
        text = (f"a collective failed ({error}) though every rank is alive: "
                f"{', '.join(where[r] for r in sorted(where))}; a rank that is not waiting is "
                f"stuck, or slower than trainer.dist_timeout_s ({dist_timeout_s:g} s) allows")
        mine = Verdict(text, [], self.rank, [])
        try:
            with self._lock:
                stored = self.store.compare_set(f"{self.prefix}/verdict", "", mine.encode())
            return Verdict.decode(stored)
        except Exception:  # noqa: BLE001 - no store: this rank says it
            return mine

    # ---- ending the run
    def report(self, verdict: Verdict, *, stream: Any = None) -> bool:
        """Print the verdict (if this rank is its reporter) and kill stopped lost peers of
        this host, once per process; False if another path already did."""
        if not self._ended.acquire(blocking=False):
            return False
        if self.rank == verdict.reporter:
            text = f"error: {verdict.text}; the run is stopped"
            if _epilogue is not None:
                try:
                    text += f"; {_epilogue()}"
                except Exception:  # noqa: BLE001 - the line must come out anyway
                    pass
            print_line(text, stream)
        for host, pid in verdict.stopped:
            if host == self.host and process_state(pid) == "stopped":
                _kill(pid)
        return True

    def set_state(self, state: str) -> None:
        """`interrupted` or `failed: <error>`: published at once (best effort)."""
        if self.state == "running":
            self.state = " ".join(str(state).split())[:500]
        try:
            self.beat()
        except Exception:  # noqa: BLE001 - a store that does not answer: nothing to tell
            pass

    # ---- the thread
    def poke(self) -> None:
        """Beat now (the activity changed)."""
        self._wake.set()

    def start(self) -> Heartbeat:
        self.beat()  # the first beat before anyone can miss it
        self._thread = threading.Thread(target=self._run, name="memrl-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self, state: str = "done") -> None:
        """Publish the final state (`done` unless failed or interrupted) and end the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(1.0, self.interval_s))
        self.set_state(state)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
                found = self.stored_verdict()
                if found is None and self.state == "running" and (lost := self.check()):
                    found = self.decide(lost)
            except Exception:  # noqa: BLE001 - the store did not answer: judge nobody
                found = None
            if found is not None and self.state == "running" and not self._stop.is_set():
                if self.report(found):
                    _exit_now(EXIT_PEER_LOST)
                return
            self._wake.wait(self.interval_s)
            self._wake.clear()


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _exit_now(code: int) -> None:
    """End the process from the watching thread: the main one may be stuck in a collective."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


# ---------------------------------------------------------------------- the process's one

_current: Heartbeat | None = None
_epilogue: Callable[[], str] | None = None


def current() -> Heartbeat | None:
    """This process's running heartbeat, if any."""
    return _current


def set_epilogue(text: Callable[[], str] | None) -> None:
    """What the lost-rank line ends with (the CLI: the last checkpoint, the command that
    continues), asked for when the line is printed."""
    global _epilogue
    _epilogue = text


def start(store: Any, rank: int, world_size: int, timeout_s: float, *,
          prefix: str = KEY_PREFIX) -> Heartbeat:
    """Start this process's heartbeat (stopping a previous one)."""
    global _current
    stop()
    _current = Heartbeat(store, rank, world_size, timeout_s, prefix=prefix).start()
    return _current


def stop(state: str = "done") -> None:
    """Stop this process's heartbeat, publishing its final state."""
    global _current
    beat, _current = _current, None
    if beat is not None:
        beat.stop(state)

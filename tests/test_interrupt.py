"""memrl.interrupt: SIGINT -> exit 130, SIGTERM -> exit 143, one line, handlers restored."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memrl.interrupt import Interrupted, exit_on_signals, interrupt_message

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

CHILD = textwrap.dedent(
    """
    import sys, time
    from memrl.interrupt import exit_on_signals

    try:
        with exit_on_signals("at step 3 of testing", "run it again to continue"):
            print("ready", flush=True)
            time.sleep(30)
    finally:
        print("cleanup ran", flush=True)
    print("not reached", flush=True)
    """
)


def _run_child(code: str, sig: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "ready\n" + out, err)


@pytest.mark.parametrize(
    ("sig", "code", "name"), [(signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")]
)
def test_signal_exits_with_code_and_one_line(sig, code, name):
    result = _run_child(CHILD, sig)
    assert result.returncode == code
    assert result.stderr.splitlines() == [
        f"interrupted ({name}) at step 3 of testing; run it again to continue"
    ]
    assert "cleanup ran" in result.stdout and "not reached" not in result.stdout


def test_second_signal_prints_no_second_message():
    code = textwrap.dedent(
        """
        import os, signal, time
        from memrl.interrupt import exit_on_signals

        with exit_on_signals("while testing", "retry"):
            try:
                print("ready", flush=True)
                time.sleep(30)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # a second signal during cleanup
                time.sleep(5)
        """
    )
    result = _run_child(code, signal.SIGINT)
    assert result.returncode == 143  # the last signal decides
    assert result.stderr.splitlines() == ["interrupted (SIGINT) while testing; retry"]


def test_handlers_are_restored_in_process():
    def mine(signum, frame):  # pragma: no cover - never called
        pass

    old_int = signal.signal(signal.SIGINT, mine)
    old_term = signal.getsignal(signal.SIGTERM)
    try:
        out = io.StringIO()
        with pytest.raises(Interrupted) as info:
            with exit_on_signals("in a test", "nothing to do", stream=out) as guard:
                assert signal.getsignal(signal.SIGINT) is not mine
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # the handler runs between bytecodes
                    pass
        assert info.value.code == 143 and info.value.signum == signal.SIGTERM
        assert guard.signum == signal.SIGTERM
        assert out.getvalue() == "interrupted (SIGTERM) in a test; nothing to do\n"
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGTERM) is old_term
        with exit_on_signals():  # no signal: the block runs, handlers come back
            pass
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, old_int)


def test_message_format():
    assert interrupt_message(signal.SIGINT) == "interrupted (SIGINT)"
    assert interrupt_message(signal.SIGTERM, "in 'memrl train'", "use --resume\n") == (
        "interrupted (SIGTERM) in 'memrl train'; use --resume"
    )


def default_sigint() -> None:
    """In the child: SIGINT as a terminal would deliver it. A runner started in the background
    by a non-interactive shell ignores SIGINT, the child would inherit that, and Python then
    installs no KeyboardInterrupt handler at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_cli_main_maps_a_real_sigint_to_130(tmp_path):
    """`memrl init-tiny-model` interrupted by Ctrl-C: one line, exit 130, no traceback."""
    code = textwrap.dedent(
        """
        import sys, time
        import memrl.models.tiny as tiny
        from memrl.cli import main

        def slow(*args, **kwargs):
            print("ready", flush=True)
            time.sleep(30)

        tiny.build_tiny_model = slow
        sys.exit(main(["init-tiny-model", sys.argv[1]]))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "model")], cwd=ROOT, env=env,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=default_sigint,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert err.splitlines() == [
        "interrupted (SIGINT) in 'memrl init-tiny-model'; run the command again to redo it"
    ]

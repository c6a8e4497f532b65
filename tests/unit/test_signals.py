"""ajet/signals.py (issue 69 §2): a stop is recorded first, honours an inherited "ignore", beats
the handlers of code ajet starts (the launcher, ray.init), and says what happened from the
first line of `main`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ajet import signals
from ajet.signals import StopNow, holding_stops, reclaim, stop_on_signals

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def test_every_signal_inherited_as_ignored_stays_ignored() -> None:
    """`nohup ajet ...` ignores SIGHUP; before, ajet installed its handler over it (it kept only
    SIGINT's "ignore") and the run stopped when the terminal closed."""
    out = _python("""
        import signal
        from ajet.signals import stop_on_signals
        with stop_on_signals():
            signal.raise_signal(signal.SIGHUP)
            signal.raise_signal(signal.SIGINT)
            print("still running")
    """, preexec_fn=lambda: (signal.signal(signal.SIGHUP, signal.SIG_IGN),
                             signal.signal(signal.SIGINT, signal.SIG_IGN)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "still running"


def test_a_handler_installed_by_other_code_is_taken_back() -> None:
    """ray.init and the launcher installed their own SIGTERM handlers over ajet's inside a run:
    a SIGTERM then raised at once, mid-update, and the step tore."""
    def foreign(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("foreign")

    with stop_on_signals():
        ours = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, foreign)  # what ray.init does
        reclaim()
        assert signal.getsignal(signal.SIGTERM) is ours
    assert signal.getsignal(signal.SIGTERM) is not ours  # given back at the end


def test_the_launcher_leaves_a_runs_handler_in_place() -> None:
    from ajet.launcher import Launcher

    with stop_on_signals():
        ours = signal.getsignal(signal.SIGTERM)
        with Launcher():
            assert signal.getsignal(signal.SIGTERM) is ours
        assert signal.getsignal(signal.SIGTERM) is ours


def test_a_held_stop_waits_and_a_second_one_stops_at_once() -> None:
    events: list[str] = []
    with stop_on_signals():
        with holding_stops("a write"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            events.append("after the first stop")
            with pytest.raises(StopNow):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.5)
        assert signals.take_requested_stop() == "SIGTERM"
    assert events == ["after the first stop"]


def test_a_second_stop_lost_while_the_first_unwinds_still_stops_at_once_naming_its_signal() -> None:
    """The double kill-anywhere chain (SIGTERM at the update) once ended with "ajet: stopped
    (stopped during the running step ...)": the second stop's StopNow was lost while the first
    stop's KeyboardInterrupt unwound the step, and the StopNow made for it named no signal."""
    with stop_on_signals(), pytest.raises(StopNow) as raised:
        with holding_stops("the running step", lambda: False):  # not holding: the first stop raises
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.5)
            except KeyboardInterrupt as first:
                assert not isinstance(first, StopNow)
                try:  # cleanup code that swallows what it meets: the second stop's StopNow is lost
                    os.kill(os.getpid(), signal.SIGHUP)
                    time.sleep(0.5)
                except BaseException:  # noqa: BLE001 - what the test stands for
                    pass
                raise
    assert str(raised.value) == "SIGHUP" and isinstance(raised.value.__cause__, KeyboardInterrupt)


def test_a_stop_during_start_up_says_so_and_exits_130(tmp_path: Path) -> None:
    """Before, a SIGTERM while ajet imported ended the process with -15 and nothing said. The
    stop lands at once (the signal is sent by the first import that ajet's command does)."""
    code = """
        import importlib, os, signal, sys
        real = importlib.import_module
        def import_module(name, *a, **k):
            if name.startswith("ajet.cli."):
                os.kill(os.getpid(), signal.SIGTERM)
            return real(name, *a, **k)
        importlib.import_module = import_module
        from ajet.cli.main import main
        main(["config", "--defaults"])
    """
    out = _python(code)
    assert out.returncode == 130, out.stderr
    assert "ajet: stopped (SIGTERM) before a run began or after it ended: nothing to save" in out.stderr
    assert "Traceback" not in out.stderr


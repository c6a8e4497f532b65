"""`ajet.faults`: the fault points of the kill-anywhere harness fire once, at the named phase and
step only, and a malformed AJET_FAULT is an error that says the format."""

from __future__ import annotations

import math
import signal

import pytest

from ajet import faults


def test_the_spec_names_a_phase_a_step_or_range_and_a_signal() -> None:
    assert faults.parse("update@2:SIGTERM") == ("update", (2, 2), signal.SIGTERM, 1)
    assert faults.parse("draw@3+:SIGKILL") == ("draw", (3, math.inf), signal.SIGKILL, 1)
    assert faults.parse("export@*:SIGINT") == ("export", (-math.inf, math.inf), signal.SIGINT, 1)
    assert faults.parse("commit@*:SIGTERMx2") == ("commit", (-math.inf, math.inf), signal.SIGTERM, 2)
    for bad in ("update", "update@2", "nowhere@1:SIGINT", "update@x:SIGINT", "update@1:SIGNOPE"):
        with pytest.raises(ValueError, match=r"AJET_FAULT=.*<phase>@<step>:<SIGNAL>"):
            faults.parse(bad)


def test_a_fault_point_fires_once_at_its_phase_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, signum: sent.append((pid, signum)))
    monkeypatch.setattr(faults, "_fired", False)
    monkeypatch.setenv("AJET_FAULT", "rollout@3+:SIGTERM")
    faults.at_step(2)
    faults.fault_point("rollout")  # step 2: too early
    faults.fault_point("update", 3)  # another phase
    assert sent == []
    faults.fault_point("rollout", 4)  # an explicit step wins over the loop's
    faults.fault_point("rollout", 5)  # once per process
    assert sent == [(faults.os.getpid(), signal.SIGTERM)]


def test_without_the_variable_a_fault_point_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AJET_FAULT", raising=False)
    monkeypatch.setattr(faults.os, "kill", lambda pid, signum: pytest.fail("no fault is configured"))
    for phase in faults.PHASES:
        faults.fault_point(phase, 1)

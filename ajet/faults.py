"""Fault injection for the kill-anywhere tests: `AJET_FAULT=<phase>@<step>:<SIGNAL>`.

With the variable set, the process sends itself SIGNAL (SIGINT, SIGTERM, SIGHUP or SIGKILL)
the first time it reaches `fault_point(<phase>)` during training step `<step>` (`*`: during any
step, so the first time it reaches the phase at all; `<step>+`: during that step or a later
one), so a test stops
a real run at an exact place instead of guessing with sleeps. Unset (every real run), a fault
point is one dictionary lookup. The phases, in the order a step meets them:

    draw        the step's batch is being drawn from the task reader
    episode     an episode's first LLM call has been answered (mid-rollout)
    rollout     the step's episodes are in, nothing is trained yet
    update      the optimizer step is about to change the weights (mid-update)
    updated     the update is done, the step is not committed
    commit      a checkpoint's files are written, not yet renamed into place (mid-commit)
    committed   the step is committed (metrics line; its checkpoint when one was due)
    validation  validation after the step is starting
    export      the end of the run: before the last checkpoint and the final model
"""

from __future__ import annotations

import math
import os
import signal
import threading

PHASES = ("draw", "episode", "rollout", "update", "updated", "commit", "committed", "validation", "export")
_ENV = "AJET_FAULT"
_lock = threading.Lock()
_fired = False
_step = 0  # the training step running now (`at_step`)


def at_step(step: int) -> None:
    """The step the points reached from now on belong to (set by the step loop)."""
    global _step
    _step = step


def fault_point(phase: str, step: int | None = None) -> None:
    """Send the configured signal if `AJET_FAULT` names this phase and step (once per process)."""
    global _fired
    spec = os.environ.get(_ENV)
    if not spec or _fired:
        return
    want_phase, (first, last), signum = parse(spec)
    if phase != want_phase or not first <= (step if step is not None else _step) <= last:
        return
    with _lock:
        if _fired:
            return
        _fired = True
    os.kill(os.getpid(), signum)


def parse(spec: str) -> tuple[str, tuple[float, float], int]:
    """`update@2:SIGTERM` -> ("update", (2, 2), signal.SIGTERM); `@*` is every step, (-inf, inf);
    `@3+` is step 3 and later, (3, inf)."""
    try:
        where, name = spec.split(":")
        phase, step = where.split("@")
        signum = int(getattr(signal, name))
        if phase not in PHASES:
            raise ValueError(phase)
        if step == "*":
            steps = (-math.inf, math.inf)
        elif step.endswith("+"):
            steps = (int(step[:-1]), math.inf)
        else:
            steps = (int(step), int(step))
        return phase, steps, signum
    except (ValueError, AttributeError):
        raise ValueError(f"{_ENV}={spec!r}: expected <phase>@<step>:<SIGNAL>, phase one of {', '.join(PHASES)}, "
                         "e.g. update@2:SIGTERM, update@3+:SIGINT or update@*:SIGKILL") from None

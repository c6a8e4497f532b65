"""Fault injection for the kill-anywhere tests: `AJET_FAULT=<phase>@<step>:<SIGNAL>[x2]`.

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

`<SIGNAL>x2` sends a second one 0.2 s after the first (from a timer thread): a second stop while
the first waits for an update or a write. `AJET_FAULT_SLOW_WRITE_S=<seconds>` makes every
checkpoint file's write wait that long first (`slow_write`), so that a stop that races a write
lands inside it rather than by luck.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time

PHASES = ("draw", "episode", "rollout", "update", "updated", "commit", "committed", "validation", "export")
_ENV = "AJET_FAULT"
_SLOW_WRITE_ENV = "AJET_FAULT_SLOW_WRITE_S"
SECOND_SIGNAL_AFTER_S = 0.2
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
    want_phase, (first, last), signum, count = parse(spec)
    if phase != want_phase or not first <= (step if step is not None else _step) <= last:
        return
    with _lock:
        if _fired:
            return
        _fired = True
    if count > 1:
        timer = threading.Timer(SECOND_SIGNAL_AFTER_S, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
    os.kill(os.getpid(), signum)


def slow_write() -> None:
    """Wait `AJET_FAULT_SLOW_WRITE_S` seconds (unset: return at once): before a checkpoint file."""
    delay = os.environ.get(_SLOW_WRITE_ENV)
    if delay:
        time.sleep(float(delay))


def parse(spec: str) -> tuple[str, tuple[float, float], int, int]:
    """`update@2:SIGTERM` -> ("update", (2, 2), signal.SIGTERM, 1); `@*` is every step, (-inf, inf);
    `@3+` is step 3 and later, (3, inf); `:SIGINTx2`: two signals (the 4th item)."""
    try:
        where, name = spec.split(":")
        phase, step = where.split("@")
        count = 2 if name.endswith("x2") else 1
        signum = int(getattr(signal, name.removesuffix("x2")))
        if phase not in PHASES:
            raise ValueError(phase)
        if step == "*":
            steps = (-math.inf, math.inf)
        elif step.endswith("+"):
            steps = (int(step[:-1]), math.inf)
        else:
            steps = (int(step), int(step))
        return phase, steps, signum, count
    except (ValueError, AttributeError):
        raise ValueError(f"{_ENV}={spec!r}: expected <phase>@<step>:<SIGNAL>, phase one of {', '.join(PHASES)}, "
                         "e.g. update@2:SIGTERM, update@3+:SIGINT, update@*:SIGKILL or commit@*:SIGTERMx2") from None

"""How a run stops: Ctrl-C, SIGTERM and SIGHUP are recorded first, then acted on where it is safe.

A scheduler (Slurm, Kubernetes), `docker stop`, `timeout`, a CI runner and a closed terminal
stop a process with SIGTERM or SIGHUP, whose default action ends it at once: whatever the step
was doing is lost with it, and nothing closes the gateway, the engine or the child processes.
Inside `stop_on_signals()` all three take Ctrl-C's path instead: an update that has begun
finishes (`ajet.own_thread`), the loop saves the last finished step (`ajet.training.loop`), the
closers run, and the command exits 130 saying how to resume.

One handler (`_on_stop`) serves every place, and it does two things in this order:
1. it **records** the stop (`_state`): a KeyboardInterrupt raised by a handler can be lost (Python
   drops an exception raised while it runs a weakref callback or a `__del__`), and the record is
   what survives: the loop acts on it at its next safe point (`raise_pending_stop`);
2. it raises KeyboardInterrupt, unless a **hold** is active (`holding_stops`): an update that has
   begun changing the weights, a step being committed, a checkpoint being written. Then the stop
   waits for that work to end and is acted on after it.
A second stop always raises `StopNow` at once: nothing more is saved; what was committed
survives.

A signal that the process inherited as ignored (`nohup`, a shell's background job) stays
ignored, whichever signal it is. Code that installs its own handlers (the launcher, `ray.init`)
runs before `reclaim()`, which puts ajet's back.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# The signals that stop a run the way Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopNow(KeyboardInterrupt):
    """A second stop while the first waits for work to finish: nothing more is saved; what was
    committed before survives."""


@dataclass
class _StopState:
    count: int = 0  # stops received since the run's handlers were installed
    pending: str | None = None  # the first stop, until a safe point takes it
    last: str | None = None  # the newest stop's signal (SIGTERM), for the message of a StopNow
    holds: list[tuple[str, Callable[[], bool]]] = field(default_factory=list)  # (what, holds now)
    in_step: int = 0  # inside a training step (`stop_at_step_end`): held stops wait for its end
    ours: set[signal.Signals] = field(default_factory=set)  # signals whose handler `stop_on_signals` installed


_state = _StopState()


def _on_stop(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    _state.count += 1
    _state.last = name
    if _state.count > 1:
        raise StopNow(name)
    _state.pending = name  # first, so that the stop survives a KeyboardInterrupt that is lost
    holding = [what for what, holds_now in _state.holds if holds_now()]
    if holding:
        log.warning("%s: finishing %s first; a second one stops at once", name, holding[-1])
        return
    raise KeyboardInterrupt(name)


_on_stop.stops_the_run = True  # type: ignore[attr-defined]


def stops_the_run(handler: Any) -> bool:
    """Whether `handler` (a signal's current one) raises KeyboardInterrupt: Ctrl-C's default, or ours."""
    return handler is signal.default_int_handler or getattr(handler, "stops_the_run", False)


def reset() -> None:
    """Forget earlier stops (a new run in this process; tests)."""
    _state.count, _state.pending, _state.last = 0, None, None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside: Ctrl-C, SIGTERM and SIGHUP record a stop and raise KeyboardInterrupt in the main
    thread (see the module's doc); a signal inherited as ignored stays ignored. Elsewhere than
    the main thread: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reset()
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    installed = {signum for signum, handler in previous.items() if handler is not signal.SIG_IGN}
    for signum in installed:
        signal.signal(signum, _on_stop)
    outer, _state.ours = _state.ours, installed
    try:
        yield
    finally:
        _state.ours = outer
        for signum in installed:
            signal.signal(signum, previous[signum])


def reclaim() -> None:
    """Put ajet's handler back where something replaced it since `stop_on_signals` installed it
    (a launcher, `ray.init`): otherwise their handlers stop the run at once, mid-update."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _state.ours:
        if signal.getsignal(signum) is not _on_stop:
            signal.signal(signum, _on_stop)


@contextlib.contextmanager
def holding_stops(what: str, holds_now: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """Inside, while `holds_now()`: a first stop is recorded and waits (`what` says for what in
    the log); the caller acts on it after the work (`raise_pending_stop`, or the loop at the
    step's end). Where the process has no handler of ajet's yet (a library call, a test), ours
    stands in for every signal whose handler stops the run, and the earlier ones come back at the
    end. When the work fails after a second stop (its StopNow, turned into another error by the
    code it interrupted, e.g. `torch.save`), the error leaves as StopNow."""
    replaced: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not _on_stop and stops_the_run(handler):
                replaced[signum] = signal.signal(signum, _on_stop)
    entry = (what, holds_now)
    _state.holds.append(entry)
    count = _state.count
    try:
        yield
    except StopNow:
        raise
    except BaseException as exc:
        if _state.count > max(count, 1):  # a second stop came during the work and broke it
            # Its StopNow was turned into `exc`, or lost (raised where Python drops it, or while the
            # first stop's KeyboardInterrupt was unwinding): the message names the signal, as the
            # first stop's does ("ajet: stopped (SIGTERM)"), and the log says what it broke.
            log.warning("%s: a second stop during %s; nothing more is saved", _state.last, what)
            raise StopNow(_state.last or "SIGINT") from exc
        raise
    finally:
        _state.holds.remove(entry)
        for signum, previous in replaced.items():
            signal.signal(signum, previous)


@contextlib.contextmanager
def stop_at_step_end(defer_now: Callable[[], bool]) -> Iterator[None]:
    """Inside (a training step): a stop that arrives once `defer_now()` holds (the step has
    begun to change the weights, or is being committed) is kept for the loop
    (`take_requested_stop`) and the step runs to its end; before that it stops at once, as
    outside. A second stop raises `StopNow`. So is a stop that `ajet.own_thread` held."""
    _state.in_step += 1
    try:
        with holding_stops("the running step (its update has begun)", defer_now):
            yield
    finally:
        _state.in_step -= 1


def in_step() -> bool:
    """Whether a training step is running (`stop_at_step_end`): a held stop waits for its end."""
    return _state.in_step > 0


def take_requested_stop() -> str | None:
    """The stop recorded and not yet taken (once), or None."""
    requested, _state.pending = _state.pending, None
    return requested


def raise_pending_stop() -> None:
    """A safe point: act on a recorded stop (KeyboardInterrupt), if there is one."""
    if threading.current_thread() is threading.main_thread() and (stop := take_requested_stop()):
        raise KeyboardInterrupt(stop)


def defer_stop(name: str) -> bool:
    """Keep the stop `name` for the end of the step, if a step is running; whether it did."""
    if not in_step():
        return False
    _state.pending = _state.pending or name
    return True


class StoppedBeforeRun(SystemExit):
    """A stop before the command's run took over the signals (the imports, the config): nothing
    was started that needs saving."""

    def __init__(self, name: str) -> None:
        super().__init__(130)
        self.name = name


def _stop_before_run(signum: int, frame: Any) -> None:
    raise StoppedBeforeRun(signal.Signals(signum).name)


@contextlib.contextmanager
def stopping_from_the_start() -> Iterator[None]:
    """From the first line of `main`: a stop exits 130 with a message (as a run's stop does),
    not with -15 and nothing said, or click's "Aborted!" and 1. A signal inherited as ignored
    stays ignored. The run's own handlers (`stop_on_signals`) take over inside it."""
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, _stop_before_run)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

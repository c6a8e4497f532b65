"""SIGTERM and SIGHUP stop a run as Ctrl-C does.

A scheduler (Slurm), `docker stop`, `timeout`, a CI runner and a closed terminal stop a process
with SIGTERM or SIGHUP, whose default action ends it at once: whatever the step was doing is
lost with it, and nothing closes the gateway, the engine or the child processes. Inside
`stop_on_signals()` both raise KeyboardInterrupt in the main thread instead, so every stop
takes Ctrl-C's path: an update that has begun finishes (`ajet.own_thread`), the loop saves
the last finished step (`ajet.training.loop`), the closers run, and the command exits non-zero
saying how to resume.

A stop that arrives during a step's update is deferred to the end of that step where the loop
allows it (`stop_at_step_end`): the update has changed the weights, so the step is finished
(logged and committed) rather than abandoned, and the run stops right after its commit.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

# Handled like Ctrl-C inside `stop_on_signals` (SIGINT already raises KeyboardInterrupt).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopNow(KeyboardInterrupt):
    """A second stop while the first waits for work to finish: nothing more is saved; what was
    committed before survives."""


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


_stop.stops_the_run = True  # type: ignore[attr-defined]  # how ajet.own_thread knows it


def stops_the_run(handler: Any) -> bool:
    """Whether `handler` (a signal's current one) raises KeyboardInterrupt: Ctrl-C's default, or ours."""
    return handler is signal.default_int_handler or getattr(handler, "stops_the_run", False)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (elsewhere: nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _DeferredStop:
    """Whether the step loop takes stops at the end of the running step, and which one came."""

    def __init__(self) -> None:
        self.allowed = False
        self.requested: str | None = None


_deferred = _DeferredStop()


@contextlib.contextmanager
def stop_at_step_end(defer_now: Callable[[], bool]) -> Iterator[None]:
    """Inside (a training step): a stop that arrives once `defer_now()` holds (the step has
    begun to change the weights, or is being committed) is kept for the loop
    (`take_requested_stop`) and the step runs to its end; before that it stops at once, as
    outside. A second stop raises `StopNow`. So is a stop that in_own_thread noted."""

    def on_stop(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if _deferred.requested is not None:
            raise StopNow(name)
        if not defer_now():
            raise KeyboardInterrupt(name)
        _deferred.requested = name
        log.warning("%s: finishing the running step first (its update has begun); a second one stops at once",
                    name)

    on_stop.stops_the_run = True  # type: ignore[attr-defined]  # in_own_thread defers it too
    with handling_stops(on_stop):
        _deferred.allowed = True
        try:
            yield
        finally:
            _deferred.allowed = False


@contextlib.contextmanager
def handling_stops(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Inside, in the main thread: `handler` for each of SIGINT, SIGTERM and SIGHUP whose
    handler now stops the run (`stops_the_run`); the earlier ones are back at the end."""
    replaced: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, *STOP_SIGNALS):
            if stops_the_run(signal.getsignal(signum)):
                replaced[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in replaced.items():
            signal.signal(signum, previous)


def defer_stop(name: str) -> bool:
    """Keep the stop `name` for the end of the step, if the loop allows it; whether it did."""
    if not _deferred.allowed:
        return False
    _deferred.requested = _deferred.requested or name
    return True


def take_requested_stop() -> str | None:
    """The stop kept for the end of the step (once), or None."""
    requested, _deferred.requested = _deferred.requested, None
    return requested

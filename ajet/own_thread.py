"""Torch work run in a thread that ends with it, so that its OpenMP thread pool ends too.

torch's CPU ops run on libgomp, which keeps a pool of worker threads for every thread that has
ever run a parallel region. Once the process holds more such threads than it has CPUs, every
pool stops spinning between parallel regions and sleeps on a futex instead (libgomp's
"throttled" spin, which no environment variable lifts). A decode step is hundreds of small
parallel ops, each of which then pays a wake-up: on 2 cores, after one update in the main
thread, the engine thread decoded 20-30 % slower for the rest of the run (fp16 engine, 16
concurrent requests: ~270 -> ~215 tok/s; scripts/bench/thread_pools.py measures it).

So the trainer's heavy torch work (an update, an SFT step, a teacher's scoring) runs in a
thread made for it: when the thread ends, its pool is given back, and while the engine decodes
its pool is the only one. A thread costs ~0.1 ms to start; a step takes seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ajet.signals import holding_stops, in_step, raise_pending_stop

T = TypeVar("T")


def in_own_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` run in a new thread, waited for; its result, or its exception
    re-raised here. A stop (Ctrl-C; SIGTERM / SIGHUP inside `ajet.signals.stop_on_signals`) while
    it runs is recorded and waits for it to finish (the weights are never left half-updated), then
    raises KeyboardInterrupt as usual, or, inside a training step (`ajet.signals.stop_at_step_end`),
    is left to the loop at the step's end. A second one raises `StopNow` at once: what was
    committed survives."""
    outcome: dict[str, Any] = {}
    name = getattr(fn, "__name__", "work")

    def target() -> None:
        try:
            outcome["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"ajet-{name}", daemon=True)
    # A stop signal is handled in the main thread, between any two bytecodes: while the work
    # runs, the first is only recorded (a KeyboardInterrupt raised there could leave this
    # function early, with the work still changing the weights).
    with holding_stops(f"the running {name} (the weights stay whole)", thread.is_alive):
        thread.start()
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    if not in_step():  # inside a step the loop takes the stop at the step's end
        raise_pending_stop()
    return outcome["result"]

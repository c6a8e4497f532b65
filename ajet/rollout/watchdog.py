"""LoopWatchdog: say so, with the line, when user code blocks the rollout's event loop.

Every episode of a rollout, and every episode timeout, runs on one asyncio loop. An async
`Workflow.execute` that calls blocking code (`time.sleep`, `requests`, a long CPU loop)
stops all of them until it returns, and `asyncio.wait_for` cannot interrupt it. The
watchdog cannot either (a running thread cannot be stopped safely); it makes the stall
visible: a heartbeat scheduled on the loop every `interval_s`, and a thread that, when the
heartbeat is older than `threshold_s`, logs a WARNING with the loop thread's current stack
(the blocking line) and the fix. Once per stall; an INFO line when the loop runs again.

The blame goes to the innermost frame that is neither the standard library nor an installed
package: when that frame is ajet's own code, the warning says so (a bug to report), rather
than sending the user to look for blocking code in a workflow that has none.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

FIX = ("use `await asyncio.sleep(...)` / `await asyncio.to_thread(f, ...)` for blocking calls, "
       "or write `execute` as a plain `def` (ajet then runs it in a worker thread)")


class LoopWatchdog:
    def __init__(self, loop: asyncio.AbstractEventLoop, *, threshold_s: float = 10.0,
                 interval_s: float = 0.5) -> None:
        self.loop = loop
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.stalls = 0  # stalls reported
        self._last = time.monotonic()
        self._loop_thread: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> LoopWatchdog:
        """Call on the loop's thread (e.g. at the start of a coroutine it runs)."""
        self._loop_thread = threading.get_ident()
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="ajet-loop-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Call on the loop's thread (which is therefore running: one last beat)."""
        self._last = time.monotonic()
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None:
            self._thread.join(2 * self.interval_s + 1)

    def _beat(self) -> None:
        self._last = time.monotonic()
        if not self._stop.is_set():
            self._timer = self.loop.call_later(self.interval_s, self._beat)

    def _watch(self) -> None:
        stalled_since: float | None = None
        while True:
            stopping = self._stop.wait(self.interval_s)
            last = self._last
            if stalled_since is not None and stalled_since != last:  # a beat since: running again
                log.info("the rollout's event loop runs again (it was blocked %.1f s)",
                         last - stalled_since - self.interval_s)
                stalled_since = None
            if stopping:
                return
            late = time.monotonic() - last - self.interval_s  # the next beat was due at last + interval
            if late > self.threshold_s and stalled_since is None:
                stalled_since = last
                self.stalls += 1
                self._report(late)

    def _report(self, late: float) -> None:
        frame = sys._current_frames().get(self._loop_thread or -1)
        if frame is None:
            stack = "  (the loop thread's stack is not available)"
        else:
            stack = "".join(traceback.format_stack(frame)[-4:]).rstrip()
        culprit = blamed_frame(frame) if frame is not None else None
        if culprit is not None and is_ajet_file(culprit.f_code.co_filename):
            log.warning("the rollout's event loop has been blocked for %.1f s by ajet's own code "
                        "(%s in %s), not by the workflow, so every episode and every episode "
                        "timeout waits. This is a bug in ajet; please report it with this "
                        "stack:\n%s", late, culprit.f_code.co_name,
                        Path(culprit.f_code.co_filename).name, stack)
            return
        log.warning("the rollout's event loop has been blocked for %.1f s, so every episode "
                    "and every episode timeout waits. Blocking code in an async workflow? "
                    "It is here:\n%s\nTo fix: %s.", late, stack, FIX)


_AJET_DIR = str(Path(__file__).resolve().parents[1])
_LIBRARY_DIRS = tuple({str(Path(sysconfig.get_paths()[k]).resolve())
                       for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def is_ajet_file(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_AJET_DIR + "/")


def blamed_frame(frame: FrameType) -> FrameType | None:
    """The innermost frame of ajet's or the user's code (skipping the standard library and
    installed packages, e.g. a tokenizer): where the blocking call was made."""
    current: FrameType | None = frame
    while current is not None:
        filename = current.f_code.co_filename
        if is_ajet_file(filename):
            return current
        if not filename.startswith("<") and not str(Path(filename).resolve()).startswith(_LIBRARY_DIRS):
            return current
        current = current.f_back
    return None

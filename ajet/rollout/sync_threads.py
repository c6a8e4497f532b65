"""SyncThreads: run a sync `Workflow.execute` in a daemon thread per episode.

A thread cannot be killed. A `concurrent.futures.ThreadPoolExecutor` is the wrong home for
code that may never return, twice over: its workers are joined when the interpreter exits,
so one `while True` (or a socket read without a timeout) kept the process alive after
training had finished; and its fixed set of workers fills up with hung calls, after which
every later episode times out while still queued. Here each call gets its own daemon
thread (the manager already bounds how many episodes run), an abandoned one is left to
finish on its own, and the interpreter does not wait for it at exit. `close()` names the
episodes still running so the log says what was abandoned. `DaemonExecutor` does the same
for the episodes' loop's default executor (`asyncio.to_thread` in an async workflow).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class _Running:
    episode_id: str
    task_id: str
    started: float
    thread: threading.Thread


class SyncThreads:
    def __init__(self) -> None:
        self._running: dict[int, _Running] = {}
        self._lock = threading.Lock()
        self._count = 0

    async def run(self, fn: Callable[..., Any], *args: Any, episode_id: str, task_id: str) -> Any:
        """`fn(*args)` in a fresh daemon thread; its result or exception, awaited on the loop.

        Cancelling the await (the episode timed out) does not stop the thread: it stays in
        `running()` until `fn` returns.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._count += 1
            key = self._count

        def settle(result: Any, exc: BaseException | None) -> None:
            if future.done():  # cancelled by the episode timeout
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)

        def target() -> None:
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting episode
                error = exc
            finally:
                with self._lock:
                    self._running.pop(key, None)
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the loop is closed: the episode was abandoned long ago
                logger.debug("episode %s: its sync execute returned after the rollout ended",
                             episode_id)

        thread = threading.Thread(target=target, name=f"ajet-workflow-{episode_id}", daemon=True)
        with self._lock:
            self._running[key] = _Running(episode_id, task_id, time.monotonic(), thread)
        thread.start()
        return await future

    def running(self) -> list[tuple[str, str, float]]:
        """(episode_id, task_id, seconds running) of every call that has not returned."""
        now = time.monotonic()
        with self._lock:
            return [(r.episode_id, r.task_id, now - r.started) for r in self._running.values()]

    def close(self) -> None:
        """Log the calls still running: they are abandoned, and the process will not wait."""
        running = self.running()
        if not running:
            return
        shown = ", ".join(f"{ep} (task {task}, {secs:.0f}s)" for ep, task, secs in running[:10])
        more = f" and {len(running) - 10} more" if len(running) > 10 else ""
        logger.warning(
            "%d sync workflow call(s) never returned and are abandoned (a thread cannot be "
            "stopped; the process exits without waiting for them): %s%s. Give blocking calls "
            "in execute a timeout.", len(running), shown, more,
        )


class DaemonExecutor(ThreadPoolExecutor):
    """A loop's default executor (what `asyncio.to_thread` and `run_in_executor(None, ...)`
    use) that runs each call in a fresh daemon thread. A workflow that hands a call which
    never returns to `asyncio.to_thread` (a socket read without timeout) then cannot hold the
    process at exit either: the standard pool's workers are joined by the interpreter.
    A ThreadPoolExecutor only because `loop.set_default_executor` accepts nothing else; its
    own worker pool is never used."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="ajet-to-thread")

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def target() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(exc)

        threading.Thread(target=target, name="ajet-to-thread", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to join: the threads are daemons, and a call still running is abandoned."""


_DAEMON_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def use_daemon_default_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Make `loop`'s default executor a `DaemonExecutor` (once per loop)."""
    if loop not in _DAEMON_LOOPS:
        loop.set_default_executor(DaemonExecutor())
        _DAEMON_LOOPS.add(loop)

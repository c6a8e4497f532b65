"""Threads for code that may never return: a sync `Workflow.execute`, `asyncio.to_thread`.

A thread cannot be killed. A `concurrent.futures.ThreadPoolExecutor` is the wrong home for
code that may never return, twice over: its workers are joined when the interpreter exits,
so one `while True` (or a socket read without a timeout) kept the process alive after
training had finished; and its fixed set of workers fills up with hung calls, after which
every later episode times out while still queued. Here each call gets a daemon thread of
its own (the manager already bounds how many episodes run): an abandoned one is left to
finish on its own, and the interpreter does not wait for it at exit.

- `run_in_daemon_thread` runs a sync `execute` (the runner awaits it with the timeout);
- `DaemonExecutor` is the episodes' loop's default executor (`asyncio.to_thread` in an
  async workflow, ajet's own prompt building);
- every call is registered under the episode that made it (`CURRENT_EPISODE`, set by the
  runner) until it returns, and `log_abandoned()` names the episodes whose calls are still
  running when the rollout closes.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

logger = logging.getLogger(__name__)

# (episode_id, task_id) of the episode whose code is running; copied into tasks and threads.
CURRENT_EPISODE: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "ajet_current_episode", default=None
)
_running: dict[int, tuple[str, str, str, float]] = {}  # key -> (episode, task, what, start)
_lock = threading.Lock()
_keys = itertools.count()


def _daemon(fn: Callable[[], None], name: str, what: str) -> None:
    """Start `fn` in a daemon thread, registered under the current episode until it returns."""
    episode = CURRENT_EPISODE.get()
    key = next(_keys)
    if episode is not None:
        with _lock:
            _running[key] = (*episode, what, time.monotonic())

    def target() -> None:
        try:
            fn()
        finally:
            with _lock:
                _running.pop(key, None)

    threading.Thread(target=target, name=name, daemon=True).start()


async def run_in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a fresh daemon thread, awaited on the running loop. Cancelling the
    await (the episode timed out) does not stop the thread: it stays registered until `fn`
    returns."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():  # cancelled by the episode timeout
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    def call() -> None:
        result, error = None, None
        try:
            result = context.run(fn, *args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting episode
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: the episode was abandoned long ago
            logger.debug("%s returned after the rollout ended", getattr(fn, "__qualname__", fn))

    episode = CURRENT_EPISODE.get()
    _daemon(call, f"ajet-workflow-{episode[0] if episode else ''}", "sync execute")
    return await future


class DaemonExecutor(ThreadPoolExecutor):
    """A loop's default executor (what `asyncio.to_thread` and `run_in_executor(None, ...)`
    use) that runs each call in a fresh, registered daemon thread. A ThreadPoolExecutor only
    because `loop.set_default_executor` accepts nothing else; its own pool is never used."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="ajet-to-thread")

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(exc)

        _daemon(call, "ajet-to-thread", "asyncio.to_thread")
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to join: the threads are daemons, and a call still running is abandoned."""


_DAEMON_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def use_daemon_default_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Make `loop`'s default executor a `DaemonExecutor` (once per loop)."""
    if loop not in _DAEMON_LOOPS:
        loop.set_default_executor(DaemonExecutor())
        _DAEMON_LOOPS.add(loop)


def running() -> list[tuple[str, str, str, float]]:
    """(episode_id, task_id, what, seconds running) of every registered call not returned."""
    now = time.monotonic()
    with _lock:
        return [(ep, task, what, now - start) for ep, task, what, start in _running.values()]


def log_abandoned() -> int:
    """Log the calls still running (abandoned: the process exits without waiting for them);
    returns how many."""
    calls = running()
    if calls:
        shown = ", ".join(f"{ep} (task {task}, {what}, {secs:.0f}s)"
                          for ep, task, what, secs in calls[:10])
        more = f" and {len(calls) - 10} more" if len(calls) > 10 else ""
        logger.warning(
            "%d call(s) made by episodes never returned and are abandoned (a thread cannot be "
            "stopped; the process exits without waiting for them): %s%s. Give blocking calls a "
            "timeout.", len(calls), shown, more,
        )
    return len(calls)

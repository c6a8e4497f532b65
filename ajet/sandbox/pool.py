"""Warm sandboxes for episodes, and the session an episode's tool calls go through.

    pool = SandboxPool(size=2, limits=Limits(wall_s=5))
    async with pool.session({"data.txt": "..."}) as box:   # a warm sandbox, files in /sandbox
        result = await box.arun_python(code)               # ~3 ms for a trivial call
        tool_text = result.as_tool_text()
    metrics = box.metrics()        # sandbox/calls, sandbox/timeouts, sandbox/oom, sandbox/refused, ...

A sandbox serves one episode and is killed at its end (nothing an episode's code did reaches
another episode); a background thread starts the next one, so `session` usually finds one
warm. The model's code cannot kill its sandbox's server (it is the sandbox's pid 1); if the
sandbox dies all the same (killed from the host, out of memory), the call reports `crashed` and
the next call gets a fresh sandbox (without the files the code wrote).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ajet.sandbox.box import Limits, RunResult, Sandbox, SandboxCrashed

log = logging.getLogger(__name__)

STATUS_METRICS = {"timeout": "sandbox/timeouts", "oom": "sandbox/oom", "refused": "sandbox/refused",
                  "output_limit": "sandbox/output_limit", "error": "sandbox/errors", "crashed": "sandbox/crashed"}


class Box(Protocol):
    """What a session drives: a local `Sandbox`, a `RemoteSandbox` (service), or the
    explicitly unsafe local runner."""

    def run_python(self, code: str, *, stdin: str = "") -> RunResult: ...
    def run(self, command: str | Sequence[str], *, stdin: str = "") -> RunResult: ...
    def write_files(self, files: Mapping[str, str | bytes]) -> None: ...
    def read_file(self, path: str, max_bytes: int = ...) -> bytes: ...
    def close(self) -> None: ...


class Sessions:
    """An episode's session on sandboxes that `acquire(files)` hands out and `release(box)`
    takes back: the one shape for a local pool and a sandbox service."""

    def acquire(self, files: Mapping[str, str | bytes] | None = None) -> Box:
        raise NotImplementedError

    def release(self, box: Box) -> None:
        box.close()

    @contextlib.contextmanager
    def session_sync(self, files: Mapping[str, str | bytes] | None = None) -> Iterator[SandboxSession]:
        session = SandboxSession(lambda: self.acquire(files), self.release)
        try:
            yield session
        finally:
            session.close()

    @contextlib.asynccontextmanager
    async def session(self, files: Mapping[str, str | bytes] | None = None) -> AsyncIterator[SandboxSession]:
        session = SandboxSession(lambda: self.acquire(files), self.release)
        try:
            yield session
        finally:
            await asyncio.to_thread(session.close)


class SandboxPool(Sessions):
    """Keeps `size` sandboxes started and ready; `acquire` takes one (or starts one when none
    is ready), `release` kills it and a background thread replaces it."""

    def __init__(self, size: int = 2, limits: Limits | None = None, *, python: str = "",
                 ro_paths: Sequence[str] = ()) -> None:
        self.size = max(0, size)
        self.limits = limits or Limits()
        self.python = python
        self.ro_paths = tuple(ro_paths)
        self._ready: queue.Queue[Sandbox] = queue.Queue()
        self._wanted = threading.Semaphore(0)
        self._closed = threading.Event()
        self.started = 0
        self.cold_starts = 0
        self._filler = threading.Thread(target=self._fill, name="sandbox-pool", daemon=True)
        for _ in range(self.size):
            self._wanted.release()
        self._filler.start()

    def _new(self) -> Sandbox:
        box = Sandbox(self.limits, python=self.python, ro_paths=self.ro_paths).start()
        self.started += 1
        return box

    def _fill(self) -> None:
        while True:
            self._wanted.acquire()
            if self._closed.is_set():
                return
            try:
                box = self._new()
            except Exception as exc:  # noqa: BLE001 - acquire() starts one itself and raises there
                log.warning("sandbox pool: could not start a sandbox: %s", exc)
                time.sleep(1.0)
                self._wanted.release()
                continue
            if self._closed.is_set():
                box.close()
                return
            self._ready.put(box)

    def acquire(self, files: Mapping[str, str | bytes] | None = None) -> Sandbox:
        """A running sandbox with `files` in /sandbox."""
        box = None
        while box is None:
            try:
                box = self._ready.get_nowait()
            except queue.Empty:
                self.cold_starts += 1
                box = self._new()
                break
            if not box.alive:
                box.close()
                box = None
                self._wanted.release()
                continue
            self._wanted.release()  # a replacement starts while this one works
        if files:
            box.write_files(files)
        return box

    def close(self) -> None:
        self._closed.set()
        self._wanted.release()
        while True:
            try:
                self._ready.get_nowait().close()
            except queue.Empty:
                break

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxSession:
    """One episode's sandbox: calls (sync and async), counted by status for the episode's
    metrics. The sandbox starts at the first call (from the pool) and is replaced if the code
    killed it."""

    def __init__(self, acquire: Any, release: Any) -> None:
        self._acquire = acquire
        self._release = release
        self.box: Any = None
        self.counts: Counter[str] = Counter()
        self.leftover = 0
        self.call_s = 0.0
        self.calls = 0

    def _box(self) -> Any:
        if self.box is None:
            self.box = self._acquire()
        return self.box

    def _count(self, result: RunResult, seconds: float) -> RunResult:
        self.calls += 1
        self.call_s += seconds
        self.counts[result.status] += 1
        self.leftover += result.leftover
        if result.status == "crashed":
            self._release(self.box)
            self.box = None
        return result

    def run_python(self, code: str, *, stdin: str = "") -> RunResult:
        started = time.perf_counter()
        result = self._box().run_python(code, stdin=stdin)
        return self._count(result, time.perf_counter() - started)

    def run(self, command: str | Sequence[str], *, stdin: str = "") -> RunResult:
        started = time.perf_counter()
        result = self._box().run(command, stdin=stdin)
        return self._count(result, time.perf_counter() - started)

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        self._file_op(lambda box: box.write_files(files))

    def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        """The bytes of a regular file under /sandbox; a link or a FIFO the code planted is
        refused (`SandboxRequestError`), never followed or waited on."""
        return self._file_op(lambda box: box.read_file(path, max_bytes))

    def _file_op(self, op: Any) -> Any:
        """`op(box)`; if the sandbox died or answered out of turn (`SandboxCrashed`), it is
        counted as crashed and dropped, so the next call gets a fresh one."""
        box = self._box()
        try:
            return op(box)
        except SandboxCrashed:
            self.counts["crashed"] += 1
            self._release(box)
            self.box = None
            raise

    async def arun_python(self, code: str, *, stdin: str = "") -> RunResult:
        return await asyncio.to_thread(self.run_python, code, stdin=stdin)

    async def arun(self, command: str | Sequence[str], *, stdin: str = "") -> RunResult:
        return await asyncio.to_thread(self.run, command, stdin=stdin)

    def metrics(self) -> dict[str, float]:
        """Counts for `WorkflowOutput.log_metrics`: sandbox/calls, one count per status that
        is not ok (sandbox/timeouts, sandbox/oom, sandbox/refused, ...), the processes killed
        because they outlived their call, and the mean call time in ms."""
        out = {"sandbox/calls": float(self.calls), "sandbox/leftover_killed": float(self.leftover)}
        for status, key in STATUS_METRICS.items():
            out[key] = float(self.counts[status])
        if self.calls:
            out["sandbox/call_ms"] = 1000.0 * self.call_s / self.calls
        return out

    def close(self) -> None:
        if self.box is not None:
            self._release(self.box)
            self.box = None

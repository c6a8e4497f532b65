"""The local engine's scheduler: the queue of requests, their admission into the decode batches,
pause/resume around weight updates, and the engine thread that runs it all.

One engine thread owns the decode loop. `LocalEngine.generate` hands a request to `submit`;
it waits in the queue and joins a running batch between two decode steps while the batch
has room (a request with n completions takes n rows): `admit` prefills the requests it takes
(ajet/engine/batch_prefill.py) into the decode batch of the model that serves them, the
policy's (all its adapters) or a frozen model's, made the first time one of its requests is
admitted. Then every active batch takes one decode step (first a jump over the tokens a
grammar forces, where `jump_forward`), the policy's first.

`pause()` blocks until no decode step is in flight; requests wait until `resume()`. Before
each forward the engine thread asks `sync_weights()` for the policy version it runs under (the
engine's copy of the weights is refreshed there: ajet/engine/policy_version.py), so a request
is never served by stale weights.

Failures stay local: a request whose prefill or sampling raises gets the exception, the
others go on; a decode step that raises fails the sequences of that step; the engine thread
keeps serving until `close()`, which fails what still waits with `EngineClosedError`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from ajet.engine.batch_prefill import jump_forced_runs, prefill_requests
from ajet.engine.decode import DecodeBatch
from ajet.engine.requests import POLICY, EngineBusyError, EngineClosedError, Request, deliver

log = logging.getLogger(__name__)

# A frozen model's decode batch (unit, policy version -> batch), made on the engine thread.
BatchFactory = Callable[[str, int], DecodeBatch]


class Scheduler:
    """The queue, admission and decode loop of one engine, on a thread of its own.

    policy: the policy's decode batch. frozen_batch: makes a frozen model's. sync_weights: the
    policy version the next forward runs under (engine thread, no forward in flight).
    on_resume: called as the last pause ends, before decoding restarts (the model back in eval
    mode). max_batch_size: most rows decoded together in one batch. max_waiting: requests
    waiting beyond which `submit` refuses with `EngineBusyError` (0: no cap)."""

    def __init__(self, policy: DecodeBatch, frozen_batch: BatchFactory, *, sync_weights: Callable[[], int],
                 on_resume: Callable[[], object], max_batch_size: int, max_waiting: int = 0,
                 jump_forward: bool = True) -> None:
        self.policy = policy
        self.frozen: dict[str, DecodeBatch] = {}  # one per frozen model served (engine thread)
        self._frozen_batch = frozen_batch
        self._sync_weights = sync_weights
        self._on_resume = on_resume
        self.max_batch_size = max_batch_size
        self.max_waiting = max_waiting
        self.jump_forward = jump_forward
        self._cv = threading.Condition()
        self._pending: deque[Request] = deque()
        self._pause_depth = 0
        self._is_paused = False
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="ajet-engine", daemon=True)
        self.thread.start()

    # ---------------------------------------------------------------- callers' side
    def submit(self, request: Request) -> None:
        """Queue a request for the next admission (raises if closed, or when too many wait)."""
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine is closed; create a new LocalEngine")
            if self.max_waiting and len(self._pending) >= self.max_waiting:
                raise EngineBusyError(f"{len(self._pending)} requests are waiting for the engine "
                                      f"(rollout.max_waiting_requests={self.max_waiting}); retry later")
            self._pending.append(request)
            self._cv.notify_all()

    def pause(self) -> None:
        """Block until no decode step is in flight; requests wait until `resume()`."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("pause() called from the engine thread would deadlock")
        with self._cv:
            self._pause_depth += 1
            self._cv.notify_all()
            while not self._is_paused and not self._closed and self.thread.is_alive():
                self._cv.wait(timeout=1.0)

    def resume(self) -> None:
        """Undo one `pause()`; the last one calls `on_resume` before decoding restarts."""
        with self._cv:
            if self._pause_depth == 0:
                raise RuntimeError("resume() without a matching pause()")
            self._pause_depth -= 1
            if self._pause_depth == 0:
                self._on_resume()
                self._cv.notify_all()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """`with scheduler.paused(): ...` — no decode step runs inside the block."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread; waiting requests fail with `EngineClosedError`."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)
            if self.thread.is_alive():
                log.warning("engine thread did not stop within %.0f s", timeout)

    @property
    def num_active(self) -> int:
        """Sequences in the running batches."""
        return sum(len(batch) for batch in self.batches())

    @property
    def num_pending(self) -> int:
        """Requests waiting to join a batch."""
        with self._cv:
            return len(self._pending)

    def batches(self) -> list[DecodeBatch]:
        """The policy's decode batch, then each frozen model's."""
        return [self.policy, *self.frozen.values()]

    # ---------------------------------------------------------------- engine thread
    def _run(self) -> None:
        with torch.inference_mode():
            while self._wait_for_work():
                try:
                    self._admit()
                except Exception as exc:  # noqa: BLE001 - a failed step must not kill the engine
                    log.exception("engine step failed; failing its %d sequences", self.num_active)
                    for batch in self.batches():
                        batch.fail(exc)
                for batch in self.batches():
                    if not batch.active:
                        continue
                    try:
                        version = self._sync_weights()
                        if self.jump_forward:
                            jump_forced_runs(batch, version)
                        if batch.active:
                            batch.step(version)
                    except Exception as exc:  # noqa: BLE001 - a failed step must not kill the engine
                        log.exception("engine step failed; failing its %d sequences", len(batch))
                        batch.fail(exc)
        self._fail_everything(EngineClosedError("the engine was closed"))

    def _wait_for_work(self) -> bool:
        with self._cv:
            while True:
                if self._closed:
                    return False
                if self._pause_depth > 0:
                    if not self._is_paused:
                        self._is_paused = True
                        self._cv.notify_all()
                    self._cv.wait()
                    continue
                self._is_paused = False
                if self._pending or any(batch.active for batch in self.batches()):
                    return True
                self._cv.wait()

    def _admit(self) -> None:
        """Take waiting requests while the batch has room; prefill them into their batches."""
        taken: list[Request] = []
        with self._cv:
            active = self.num_active
            room = self.max_batch_size - active
            while self._pending:
                request = self._pending[0]
                if request.params.n > room and (active or taken):
                    break
                self._pending.popleft()
                if not request.cancelled:
                    taken.append(request)
                    room -= request.params.n
        if not taken:
            return
        version = self._sync_weights()
        by_unit: dict[str, list[Request]] = {}
        for request in taken:
            by_unit.setdefault(request.target.unit, []).append(request)
        for unit, requests in by_unit.items():
            try:
                batch = self._batch_of(unit, version)
            except Exception as exc:  # noqa: BLE001 - e.g. the initial copy failed: these requests only
                log.warning("model %r cannot be served: %s", unit, exc)
                for request in requests:
                    deliver(request, error=exc)
                continue
            prefill_requests(batch, requests, version)

    def _batch_of(self, unit: str, version: int) -> DecodeBatch:
        """The decode batch of a unit; a frozen model's is made when it is first served."""
        if unit == POLICY:
            return self.policy
        batch = self.frozen.get(unit)
        if batch is None:
            batch = self.frozen[unit] = self._frozen_batch(unit, version)
        return batch

    def _fail_everything(self, error: BaseException) -> None:
        for batch in self.batches():
            batch.fail(error)
        with self._cv:
            pending, self._pending = list(self._pending), deque()
        for request in pending:
            deliver(request, error=error)

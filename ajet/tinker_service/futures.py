"""Tinker's futures: every training and sampling call answers at once with a `request_id`, and
its result is fetched with `POST /api/v1/retrieve_future`.

`retrieve` long-polls: it holds the request until the result is there or `wait_s` passed, then
answers `{"type": "try_again"}` (the SDK polls again at once). A client therefore blocks on
`future.result()` or polls `future.done()`, both through the same route.

How a future can end without its result, and what the client gets (never a hang on a live
service):
- its work failed: `{"error", "category"}`, which the SDK raises as `tinker.RequestFailedError`;
- the service stops (Ctrl-C, SIGTERM): every pending future fails with "ajet tinker stopped",
  answered to the long polls before the server exits;
- the service was restarted: an id minted by an earlier run (each run has its own `boot` prefix)
  is answered as failed, naming the restart. A service killed outright and not restarted
  answers nothing: the SDK retries a refused connection without limit, so give
  `result(timeout=...)` where that matters (docs/tinker.md).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from ajet.tinker_service.errors import TinkerServiceError

log = logging.getLogger(__name__)

KEEP = 4096  # finished futures kept for retrieval (oldest dropped first)


@dataclass
class Failure:
    message: str
    category: str = "user"  # "user" (the request) or "server" (this service)


class FutureStore:
    def __init__(self) -> None:
        self.boot = secrets.token_hex(4)  # this run's prefix of every request id
        self._count = 0
        self._futures: OrderedDict[str, asyncio.Future[Any]] = OrderedDict()
        self._closed: Failure | None = None

    def submit(self, work: Awaitable[Any]) -> str:
        """Start `work` (on the running loop) and return its request id; its result (or the
        exception it raises) is what `retrieve` answers."""
        self._count += 1
        request_id = f"{self.boot}-{self._count}"
        future = asyncio.ensure_future(work)
        future.add_done_callback(_log_unexpected)
        self._futures[request_id] = future
        while len(self._futures) > KEEP and next(iter(self._futures.values())).done():
            self._futures.popitem(last=False)
        return request_id

    async def retrieve(self, request_id: str, wait_s: float) -> Any:
        """The result, a `Failure`, or None when still running after `wait_s`."""
        future = self._futures.get(request_id)
        if future is None:
            if not request_id.startswith(f"{self.boot}-"):
                return Failure(f"request {request_id} was made to an earlier run of this service, which stopped "
                               "before answering it (the service restarted): its result is lost; send it again "
                               "(saved checkpoints are kept)", "server")
            return Failure(f"unknown request {request_id}", "user")
        if self._closed is not None and not future.done():
            return self._closed
        if not future.done():
            done, _ = await asyncio.wait({future}, timeout=wait_s)  # never raises the work's error
            if not done:
                return self._closed
        return outcome(future)

    def close(self, message: str) -> None:
        """Fail every pending future with `message` (the service is stopping)."""
        self._closed = Failure(message, "server")
        for future in self._futures.values():
            if not future.done():
                future.cancel()


def outcome(future: asyncio.Future[Any]) -> Any:
    if future.cancelled():
        return Failure("ajet tinker stopped before this request finished", "server")
    error = future.exception()
    if isinstance(error, TinkerServiceError):
        return Failure(str(error), "user")
    if error is not None:
        return Failure(f"{type(error).__name__}: {error}", "server")
    return future.result()


def _log_unexpected(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and (error := future.exception()) and not isinstance(error, TinkerServiceError):
        log.error("a request failed in the service", exc_info=error)

"""Retries with backoff for the HTTP endpoints a run depends on: a distillation teacher, an env
service. A server that restarts, or answers 503 while it is loaded, must not end a long run.

What is retried: a request that never reached the server (connect errors), and the answers
that say "not now" (429, 502, 503, 504); for an idempotent request (scoring, listing tasks)
also timeouts and any 5xx. An env step is not idempotent: a timed-out one may have been
applied, so it is not sent again. Waits grow exponentially (0.5 s to 8 s) within a bounded
total (`max_wait_s`); then the last answer or error is the caller's, which names the endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import httpx
import tenacity

log = logging.getLogger(__name__)

NOT_NOW = frozenset({429, 502, 503, 504})


def _transient_error(exc: BaseException, idempotent: bool) -> bool:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    return idempotent and isinstance(exc, httpx.TransportError)


def _transient_reply(reply: httpx.Response, idempotent: bool) -> bool:
    return reply.status_code in NOT_NOW or (idempotent and reply.status_code >= 500)


def _policy(what: str, idempotent: bool, max_wait_s: float) -> dict:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        why = (f"HTTP {outcome.result().status_code}" if outcome is not None and not outcome.failed
               else repr(outcome.exception()) if outcome is not None else "?")
        log.warning("%s: %s; retrying (attempt %d, up to %.0f s in all)", what, why, state.attempt_number + 1,
                    max_wait_s)

    return {
        "stop": tenacity.stop_after_delay(max_wait_s),
        "wait": tenacity.wait_exponential(multiplier=0.5, max=8),
        "retry": (tenacity.retry_if_exception(lambda e: _transient_error(e, idempotent))
                  | tenacity.retry_if_result(lambda r: _transient_reply(r, idempotent))),
        "before_sleep": before_sleep,
        "retry_error_callback": lambda state: state.outcome.result(),  # the last reply, or its error
    }


def send_with_retries(send: Callable[[], httpx.Response], *, what: str, idempotent: bool,
                      max_wait_s: float = 60.0) -> httpx.Response:
    """`send()` until it gives an answer worth returning or `max_wait_s` has passed."""
    return tenacity.Retrying(**_policy(what, idempotent, max_wait_s))(send)


async def asend_with_retries(send: Callable[[], Awaitable[httpx.Response]], *, what: str, idempotent: bool,
                             max_wait_s: float = 60.0) -> httpx.Response:
    """`send_with_retries` for a coroutine."""
    return await tenacity.AsyncRetrying(**_policy(what, idempotent, max_wait_s))(send)

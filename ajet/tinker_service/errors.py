"""The errors `ajet tinker` answers, each with its HTTP status and code (the routes translate
them, `ajet.tinker_service.routes`). Raised below the routes (by the trainer, the sampler, the
checkpoint store) and caught only at that boundary.

A request whose work already started (it has a future) fails through its future instead: the
SDK's `retrieve_future` gets `{"error", "category"}` and raises `tinker.RequestFailedError`
with the message. Nothing is answered 5xx on purpose: the SDK retries 5xx (and 408, 409, 429)
for minutes, where a 4xx reaches the user's script at once.
"""

from __future__ import annotations


class TinkerServiceError(Exception):
    """A request the service refuses, with its HTTP status and a short code."""

    status: int = 400
    code: str = "bad_request"


class BadRequestError(TinkerServiceError):
    """A malformed or inconsistent request; the message says which field."""


class NotServedError(TinkerServiceError):
    """A feature of the Tinker API that `ajet tinker` does not serve; the message names it."""

    status, code = 400, "not_served"

    def __init__(self, feature: str, hint: str = "docs/tinker.md lists what is") -> None:
        super().__init__(f"{feature} is not served by ajet tinker ({hint})")


class NotFoundError(TinkerServiceError):
    """An unknown session, model, sampler, future or checkpoint."""

    status, code = 404, "not_found"


class GoneError(TinkerServiceError):
    """A finished session (the SDK's heartbeat stops on 410)."""

    status, code = 410, "gone"

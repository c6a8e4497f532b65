"""The errors a chat call reports to the agent (the gateway turns each into its HTTP status)."""

from __future__ import annotations

UNSUPPORTED = "unsupported_parameter"  # `error.code` of a field or value ajet does not honour


class SessionError(Exception):
    """Base class for errors a chat call reports to the agent."""


class SessionClosedError(SessionError):
    """The episode has ended; its model and keys are dead."""


class InvalidRequestError(SessionError, ValueError):
    """A request parameter is unknown, unsupported or out of range. `param` names the field
    when one field is to blame (the gateway's `error.param`); `code` is the gateway's
    `error.code` ("unsupported_parameter": a field or value ajet does not honour)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ContextBudgetError(SessionError, ValueError):
    """The prompt alone exceeds the per-call / model-window budget."""


class CallLimitError(SessionError):
    """The episode has made `rollout.max_calls_per_episode` calls; no more are served."""


class EngineBusy(SessionError):
    """The engine's waiting queue is full (`rollout.max_waiting_requests`); retry later."""

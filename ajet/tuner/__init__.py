"""The model a workflow talks to: `ModelTuner` (AgentScope model), `EpisodeSession`
(one episode's recorded chat calls) and `Gateway` (OpenAI-compatible HTTP).

Importing this package imports agentscope (ModelTuner subclasses its ChatModelBase);
`import ajet` and the CLI do not import it.
"""

from __future__ import annotations

from ajet.tuner.gateway import Gateway, GatewayError
from ajet.tuner.model_tuner import ModelTuner, RoleNotRegisteredError
from ajet.tuner.session import (
    ChatResult,
    ContextBudgetError,
    EpisodeSession,
    InvalidRequestError,
    SessionClosedError,
    SessionError,
)

__all__ = [
    "ChatResult",
    "ContextBudgetError",
    "EpisodeSession",
    "Gateway",
    "GatewayError",
    "InvalidRequestError",
    "ModelTuner",
    "RoleNotRegisteredError",
    "SessionClosedError",
    "SessionError",
]

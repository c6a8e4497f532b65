"""ajet's errors, in one hierarchy. The CLI only formats them (`ajet.cli.common.user_errors`).

- `UserError` (exit 2): bad input the user can fix (config, data, workflow, model path). The
  message names the place and the fix; it is printed without a traceback.
  - `ConfigError`: a bad config key or value.
- `SetupError` (exit 1): this machine cannot run what was asked (no GPU, a missing extra).
- `InfrastructureError`: the engine, gateway or session failed, not the workflow.
- `BadOutputError`: a workflow returned something that is not a reward or a `WorkflowOutput`.
"""

from __future__ import annotations

EXIT_USER = 2  # bad config / bad input (like a usage error)
EXIT_SETUP = 1  # the environment cannot run this


class AjetError(Exception):
    """An error ajet reports as one message and an exit code, without a traceback."""

    exit_code = EXIT_SETUP

    def __init__(self, message: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UserError(AjetError):
    """Bad input: the message names the place and the fix."""

    exit_code = EXIT_USER


class ConfigError(UserError):
    """A user error in the config; the message says where and how to fix it."""


class AllEpisodesFailedError(UserError):
    """Every episode failed for `rollout.max_failed_steps` consecutive steps (the workflow or
    its environment is broken; nothing would be trained)."""


class DivergedError(UserError):
    """`trainer.max_nonfinite_steps` updates in a row had a non-finite loss, loss term or
    gradient norm (the message suggests the settings to change)."""


class SetupError(AjetError):
    """The environment cannot run this (no GPU, a missing optional extra, ...)."""

    exit_code = EXIT_SETUP


class InfrastructureError(Exception):
    """The engine, gateway or session failed, not the workflow.

    Raised by the tuner/engine. The runner retries the episode on a fresh session
    (with backoff, up to `rollout.max_retries`); a workflow's own exceptions are never retried.
    """


class BadOutputError(Exception):
    """A workflow returned something that is not a reward or a `WorkflowOutput`."""

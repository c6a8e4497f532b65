"""ajet's errors, in one hierarchy. The CLI only formats them (`ajet.cli.common.user_errors`).

- `AjetError`: ends a command with one message and an exit code, no traceback.
  - `UserError` (exit 2): bad input the user can fix; the message names the place and the fix.
    `ConfigError` (a config key or value) · `WorkflowLoadError` > `WorkflowSignatureError` ·
    `TaskReaderError` > `EnvServiceError` · `CurriculumError` · `JudgeError` · `EvalError` ·
    `DialogDataError` (SFT data) · `ModelNotFoundError` · `RunDataError` (a run directory the
    report / viewer reads) · `AllEpisodesFailedError` · `DivergedError`
  - `SetupError` (exit 1): this machine cannot run what was asked (no GPU, a missing extra).
    `LaunchError`: a service, cluster or GPU the run needs is not there. `DiskFullError`: a
    checkpoint could not be written for want of disk space.
- `InfrastructureError`: the engine, gateway or session failed, not the workflow (the rollout
  runner retries the episode).
- `BadOutputError`: a workflow returned something that is not a reward or a `WorkflowOutput`.

What lives here: every `AjetError` (what the CLI reports), and the classifications the rollout
runner acts on across modules (`InfrastructureError`, `BadOutputError`). An exception class
stays in the module that raises it when it is
- private control flow, raised and caught inside that module or its component
  (`config.loader._DuplicateKey`, `tuner.gateway._RequestError`, `task_reader.jsonl.MalformedRow`,
  `judge.countdown.MalformedExpression`), or a backbone adapter's error raised into the
  framework that drives it (`backbones.verl.convert.SampleTooLongError`, a ValueError verl
  reports); or
- one component's protocol with its callers, translated at the component's boundary: it
  subclasses the builtin a caller catches (ValueError, KeyError, RuntimeError) and the
  component's package exports it. The engine's `PromptTooLongError` / `GrammarError`
  (ValueErrors: the session reports a bad request) and `EngineClosedError` (the session raises
  `InfrastructureError` for it); the session's `SessionError` family (the gateway answers the
  matching OpenAI error); the episode API's `EpisodeRequestError` family (one HTTP status
  each); `GatewayError`; `RoleNotRegisteredError` (a KeyError of `ModelTuner.get_model`); and
  `ajet.serve.client.EpisodeAPIError`, kept with the client because the client imports nothing of
  ajet.
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


class WorkflowLoadError(UserError):
    """The workflow could not be loaded; the message says what failed and the expected form."""


class WorkflowSignatureError(WorkflowLoadError):
    """A workflow function does not have the signature `async def fn(task: dict, model) -> float:`."""


class TaskReaderError(UserError):
    """A problem with the tasks or their source; the message says where and how to fix it."""


class EnvServiceError(TaskReaderError):
    """The env service could not be reached (`status_code` None) or refused a request."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class CurriculumError(UserError):
    """A task without a usable difficulty; the message names the task and the key."""


class JudgeError(UserError):
    """A judge is misconfigured or cannot score; the message says what to fix."""


class EvalError(UserError):
    """Nothing to evaluate (empty split) or a bad eval setting."""


class DialogDataError(UserError):
    """A dialog file or line is malformed; the message names file:line and the fix."""


class ModelNotFoundError(UserError):
    """The configured model is not available on this machine."""


class RunDataError(UserError):
    """A run directory lacks the files the viewer or report reads, or holds malformed data."""


class TeacherUnavailable(UserError):
    """A distillation teacher endpoint that did not answer, or answered no logprobs, after its retries."""


class SetupError(AjetError):
    """The environment cannot run this (no GPU, a missing optional extra, ...)."""

    exit_code = EXIT_SETUP


class LaunchError(SetupError):
    """A service, cluster or GPU the run needs is not there (exit code 1, no traceback)."""


class DiskFullError(SetupError):
    """A checkpoint or model could not be written: the disk is full (exit code 1, no traceback)."""


class SandboxUnavailableError(SetupError):
    """The sandbox for model-written code cannot start here (bubblewrap missing, user
    namespaces disabled); the message names the cause and the fix (ajet.sandbox)."""


class InfrastructureError(Exception):
    """The engine, gateway or session failed, not the workflow.

    Raised by the tuner/engine. The runner retries the episode on a fresh session
    (with backoff, up to `rollout.max_retries`); a workflow's own exceptions are never retried.
    """


class BadOutputError(Exception):
    """A workflow returned something that is not a reward or a `WorkflowOutput`."""

"""TaskRunner: run one episode of the workflow on one task, whatever happens.

`run_episode` never raises for a workflow's or judge's fault: every ending becomes an
`Episode` with a status and a reason (see `ajet.rollout.episode.Episode`). Only
infrastructure errors (engine, gateway, session: `InfrastructureError`, `ConnectionError`,
`httpx.TransportError`, `openai.APIConnectionError`, `openai.InternalServerError`; also when
user code raised its own error from one) are retried, each on a fresh episode handle, with
exponential backoff.

The runner keeps no global state: the workflow, judge and session factory are injected,
so the same object can later live inside a Ray actor.

Sync workflows: a `Workflow.execute` written as a plain `def` runs in a daemon thread of
its own (`ajet.rollout.sync_threads`). A thread cannot be killed: when such an episode times
out, the episode is marked `timeout`, its handle is closed (further model calls from that
thread fail) and the thread is abandoned until its code returns; it never holds the process
at exit, and `close()` logs the episodes abandoned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import sys
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol

from pydantic import ValidationError

from ajet.config.schema import RolloutConfig
from ajet.errors import BadOutputError, InfrastructureError
from ajet.judge.base import Judge
from ajet.rollout.episode import TIMEOUT, Episode
from ajet.rollout.scoring import (
    bad_output,
    close_handle,
    collect_refusals,
    collect_tracker,
    episode_roles,
    fail,
    log_failure,
    maybe_await,
    score_episode,
    summary,
)
from ajet.rollout.sync_threads import CURRENT_EPISODE, log_abandoned, run_in_daemon_thread
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask, describe_output_error

logger = logging.getLogger(__name__)


class EpisodeHandle(Protocol):
    """What a `SessionFactory` opens for one episode attempt."""

    tuner: Any  # handed to Workflow.execute
    tracker: Any  # anything with timelines(), stats(), calls

    def close(self) -> None:
        """Unregister the episode's keys and free its state (may also be `async def`)."""


class SessionFactory(Protocol):
    """Injected by the backbone: opens a fresh session (tuner + tracker) per episode attempt."""

    def open_episode(self, episode_id: str, task: WorkflowTask) -> EpisodeHandle:
        """May also be `async def`."""


# Called with a workflow's exception where the runner catches it, before the episode is
# recorded as failed (`ajet episode --pdb` opens the debugger there, the workflow's frames alive).
# Set it around a rollout: the episodes' tasks copy it when they start.
ON_WORKFLOW_ERROR: ContextVar[Callable[[BaseException], None] | None] = ContextVar("ON_WORKFLOW_ERROR", default=None)


@dataclasses.dataclass
class _Raised:
    """An exception the workflow raised, carried out of `wait_for` so that a workflow's own
    TimeoutError is not mistaken for the episode timeout."""

    exc: BaseException


class TaskRunner:
    def __init__(
        self,
        workflow: Workflow,
        judge: Judge | None,
        factory: SessionFactory,
        config: RolloutConfig,
        *,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.workflow = workflow
        self.judge = judge
        self.factory = factory
        self.config = config
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._sync_execute = not inspect.iscoroutinefunction(type(workflow).execute)

    async def run_episode(self, task: WorkflowTask, episode_id: str, group_id: str) -> Episode:
        start = time.monotonic()
        retries = 0
        while True:
            episode = Episode(episode_id=episode_id, task=task, group_id=group_id, retries=retries)
            infra_error = await self._attempt(episode)
            if infra_error is None:
                break
            if retries >= self.config.max_retries:
                fail(episode, f"infrastructure:{type(infra_error).__name__}", infra_error)
                logger.warning(
                    "episode %s (task %s): infrastructure error after %d retries: %s",
                    episode_id,
                    task.task_id,
                    retries,
                    summary(infra_error),
                )
                break
            delay = min(self.max_backoff_s, self.backoff_s * 2**retries)
            logger.info(
                "episode %s (task %s): infrastructure error (%s); retry %d/%d in %.1fs",
                episode_id,
                task.task_id,
                summary(infra_error),
                retries + 1,
                self.config.max_retries,
                delay,
            )
            retries += 1
            await asyncio.sleep(delay)
        episode.duration_s = time.monotonic() - start
        return episode

    def close(self) -> None:
        """Log the episodes' calls still running: abandoned, they never hold the process."""
        log_abandoned()

    # ------------------------------------------------------------------ one attempt

    async def _attempt(self, episode: Episode) -> BaseException | None:
        """Fill `episode`; return the exception when the attempt should be retried."""
        try:
            handle = await maybe_await(self.factory.open_episode(episode.episode_id, episode.task))
        except Exception as exc:  # noqa: BLE001 - classified right here
            if _is_infrastructure(exc):
                return exc
            fail(episode, f"session_error:{type(exc).__name__}", exc)
            log_failure(episode, exc)
            return None
        try:
            result = await self._execute_with_timeout(episode, handle.tuner)
            if result is TIMEOUT:
                episode.status, episode.reason = TIMEOUT, "timeout"
                episode.error_message = (
                    f"the workflow ran longer than {self.config.episode_timeout_s}s"
                )
                log_failure(episode, None)
            elif isinstance(result, _Raised):
                if _is_infrastructure(result.exc):
                    return result.exc
                self._record_workflow_error(episode, result.exc)
            else:
                await score_episode(episode, result, self.judge, self.config.episode_timeout_s,
                                    workflow=self.workflow.name, roles=episode_roles(handle))
            collect_tracker(episode, handle.tracker)
            collect_refusals(episode, handle)
        finally:
            await close_handle(handle, episode.episode_id)
        return None

    async def _execute_with_timeout(self, episode: Episode, tuner: Any) -> Any:
        async def guarded() -> Any:
            # Set inside the task wait_for creates, so the episode's threads are named for it.
            CURRENT_EPISODE.set((episode.episode_id, episode.task.task_id))
            try:
                return await self._execute(episode, tuner)
            except Exception as exc:  # noqa: BLE001 - carried out and classified by the caller
                return _Raised(exc)

        try:
            return await asyncio.wait_for(guarded(), timeout=self.config.episode_timeout_s)
        except asyncio.TimeoutError:
            return TIMEOUT

    async def _execute(self, episode: Episode, tuner: Any) -> Any:
        if not self._sync_execute:
            return await self.workflow.execute(episode.task, tuner)
        return await run_in_daemon_thread(self.workflow.execute, episode.task, tuner)

    def _record_workflow_error(self, episode: Episode, exc: BaseException) -> None:
        if (hook := ON_WORKFLOW_ERROR.get()) is not None:
            hook(exc)
        if isinstance(exc, BadOutputError):
            bad_output(episode, str(exc), workflow=self.workflow.name)
            return
        if isinstance(exc, ValidationError) and exc.title == WorkflowOutput.__name__:
            # The workflow built a WorkflowOutput with a wrong field (reward="high", NaN...).
            bad_output(episode, f"invalid WorkflowOutput: {describe_output_error(exc)}",
                       workflow=self.workflow.name)
            return
        fail(episode, f"workflow_error:{type(exc).__name__}", exc)
        log_failure(episode, exc)


def _infrastructure_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [InfrastructureError, ConnectionError]
    try:
        import httpx  # light, and a core dependency; imported here to keep this module lean

        types.append(httpx.TransportError)
    except ImportError:  # pragma: no cover - httpx is a dependency
        pass
    openai = sys.modules.get("openai")  # only if the workflow already uses it
    if openai is not None and hasattr(openai, "APIConnectionError"):
        # Unreachable gateway, or a 5xx from it: the gateway answers 500 when the
        # session/engine failed (after the OpenAI client's own retries).
        types.extend([openai.APIConnectionError, openai.InternalServerError])
    return tuple(types)


def _is_infrastructure(exc: BaseException) -> bool:
    """True for engine/gateway failures, also when user code wrapped them in its own error."""
    infra = _infrastructure_types()
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, infra):
            return True
        stack.extend([current.__cause__, current.__context__])
        stack.extend(getattr(current, "exceptions", None) or [])  # exception groups
    return False

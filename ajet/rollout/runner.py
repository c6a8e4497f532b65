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
import math
import numbers
import sys
import time
import traceback
from typing import Any, Protocol

from pydantic import ValidationError

from ajet.config.schema import RolloutConfig
from ajet.rollout.episode import FAILED, OK, TIMEOUT, BadOutputError, Episode, InfrastructureError
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


class Judge(Protocol):
    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> tuple[float, bool]: ...


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
                _fail(episode, f"infrastructure:{type(infra_error).__name__}", infra_error)
                logger.warning(
                    "episode %s (task %s): infrastructure error after %d retries: %s",
                    episode_id,
                    task.task_id,
                    retries,
                    _summary(infra_error),
                )
                break
            delay = min(self.max_backoff_s, self.backoff_s * 2**retries)
            logger.info(
                "episode %s (task %s): infrastructure error (%s); retry %d/%d in %.1fs",
                episode_id,
                task.task_id,
                _summary(infra_error),
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
            handle = await _maybe_await(self.factory.open_episode(episode.episode_id, episode.task))
        except Exception as exc:  # noqa: BLE001 - classified right here
            if _is_infrastructure(exc):
                return exc
            _fail(episode, f"session_error:{type(exc).__name__}", exc)
            self._log_failure(episode, exc)
            return None
        try:
            result = await self._execute_with_timeout(episode, handle.tuner)
            if result is TIMEOUT:
                episode.status, episode.reason = TIMEOUT, "timeout"
                episode.error_message = (
                    f"the workflow ran longer than {self.config.episode_timeout_s}s"
                )
                self._log_failure(episode, None)
            elif isinstance(result, _Raised):
                if _is_infrastructure(result.exc):
                    return result.exc
                self._record_workflow_error(episode, result.exc)
            else:
                await self._score(episode, result)
            self._collect_tracker(episode, handle.tracker)
        finally:
            await _close(handle, episode.episode_id)
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
        if isinstance(exc, BadOutputError):
            self._bad_output(episode, str(exc))
            return
        if isinstance(exc, ValidationError) and exc.title == WorkflowOutput.__name__:
            # The workflow built a WorkflowOutput with a wrong field (reward="high", NaN...).
            self._bad_output(episode, f"invalid WorkflowOutput: {describe_output_error(exc)}")
            return
        _fail(episode, f"workflow_error:{type(exc).__name__}", exc)
        self._log_failure(episode, exc)

    # ------------------------------------------------------------------ reward

    async def _score(self, episode: Episode, output: Any) -> None:
        if not isinstance(output, WorkflowOutput):
            self._bad_output(episode, (
                f"execute returned {type(output).__name__}, not a WorkflowOutput; "
                "return WorkflowOutput(reward=...) (or reward=None to let the judge score it)"
            ))
            return
        episode.output = output
        if output.reward is not None:
            reward, success = float(output.reward), output.is_success
            if not math.isfinite(reward):  # assigned past validation (e.g. model_construct)
                self._bad_output(episode, f"reward={reward!r}: a reward must be a finite number")
                return
        elif self.judge is None:
            episode.status, episode.reason = FAILED, "no_reward"
            episode.error_message = (
                "the workflow returned reward=None and no judge is configured; return "
                "WorkflowOutput(reward=...) or set judge.type (e.g. judge.type=math)"
            )
            self._log_failure(episode, None)
            return
        else:
            judged = await self._judge(episode, output)
            if judged is None:
                return
            reward, success = judged
            output.reward, output.is_success = reward, success
        episode.reward = reward
        # No explicit verdict: a reward at the top of the usual 0..1 scale counts as a success
        # (partial credit such as 0.2 for a near miss does not).
        episode.is_success = bool(success) if success is not None else reward >= 1.0
        episode.status = OK

    async def _judge(
        self, episode: Episode, output: WorkflowOutput
    ) -> tuple[float, bool | None] | None:
        """The judge's (reward, is_success), or None after marking the episode failed."""
        judge = self.judge
        try:
            if hasattr(judge, "acompute_reward"):
                call = judge.acompute_reward(episode.task, output)
            else:
                # Called on the loop thread: math judges may rely on signal-based timeouts.
                call = _maybe_await(judge.compute_reward(episode.task, output))
            verdict = await asyncio.wait_for(call, timeout=self.config.episode_timeout_s)
        except asyncio.TimeoutError:
            episode.status, episode.reason = TIMEOUT, "judge_timeout"
            episode.error_message = f"the judge ran longer than {self.config.episode_timeout_s}s"
            self._log_failure(episode, None)
            return None
        except Exception as exc:  # noqa: BLE001 - any judge failure fails this episode only
            _fail(episode, f"judge_error:{type(exc).__name__}", exc)
            self._log_failure(episode, exc)
            return None
        judged = _as_verdict(verdict)
        if judged is not None and math.isfinite(judged[0]):
            return judged
        if judged is None:
            episode.reason = "judge_error:bad_return"
            expected = "expected (reward, is_success)"
        else:
            episode.reason = "judge_error:non_finite_reward"
            expected = "a reward must be a finite number; the episode is not trained on"
        episode.status = FAILED
        episode.error_message = (
            f"{type(judge).__name__} returned {verdict!r:.80} for task "
            f"{episode.task.task_id!r}; {expected}"
        )
        self._log_failure(episode, None)
        return None

    def _bad_output(self, episode: Episode, what: str) -> None:
        """Fail the episode as `bad_output`; the message names the workflow and the task."""
        episode.status, episode.reason = FAILED, "bad_output"
        episode.error_message = (
            f"{what} (workflow {self.workflow.name!r}, task {episode.task.task_id!r})"
        )
        self._log_failure(episode, None)

    # ------------------------------------------------------------------ bookkeeping

    def _collect_tracker(self, episode: Episode, tracker: Any) -> None:
        if tracker is None:
            return
        try:
            episode.num_calls = len(tracker.calls)
            stats = tracker.stats()
            episode.tracker_stats = (
                dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)
            )
            if episode.status == OK:
                episode.timelines = list(tracker.timelines())
        except Exception as exc:  # noqa: BLE001 - a broken tracker fails this episode only
            if episode.status == OK:
                _fail(episode, f"tracker_error:{type(exc).__name__}", exc)
                self._log_failure(episode, exc)
            else:
                logger.debug(
                    "episode %s: tracker unreadable after failure: %s", episode.episode_id, exc
                )

    def _log_failure(self, episode: Episode, exc: BaseException | None) -> None:
        detail = _summary(exc) if exc is not None else episode.error_message
        logger.warning(
            "episode %s (task %s) %s: %s [%s]",
            episode.episode_id,
            episode.task.task_id,
            episode.status,
            episode.reason,
            detail,
        )


def _as_verdict(verdict: Any) -> tuple[float, bool | None] | None:
    """A judge's return value as (reward, is_success), or None when it is neither a number
    nor a pair. Strings are refused (no silent "0.7" -> 0.7), as in `WorkflowOutput`."""
    reward, success = (verdict if isinstance(verdict, tuple | list) and len(verdict) == 2
                       else (verdict, None))
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
        return None
    return float(reward), (None if success is None else bool(success))


def _fail(
    episode: Episode, reason: str, exc: BaseException, *, with_traceback: bool = True
) -> None:
    episode.status, episode.reason = FAILED, reason
    if with_traceback:
        episode.error_message = "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        )
    else:
        episode.error_message = str(exc)


def _summary(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


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
    stack = [exc]
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


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _close(handle: Any, episode_id: str) -> None:
    try:
        await _maybe_await(handle.close())
    except Exception as exc:  # noqa: BLE001 - a failing close must not hide the episode's result
        logger.warning("episode %s: closing its session failed: %s", episode_id, _summary(exc))

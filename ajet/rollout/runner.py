"""TaskRunner: run one episode of the workflow on one task, whatever happens.

`run_episode` never raises for a workflow's or judge's fault: every ending becomes an
`Episode` with a status and a reason (see `ajet.rollout.episode.Episode`). Only
infrastructure errors (engine, gateway, session: `InfrastructureError`, `ConnectionError`,
`httpx.TransportError`, `openai.APIConnectionError`, `openai.InternalServerError`; also when
user code raised its own error from one) are retried, each on a fresh episode handle, with
exponential backoff.

The runner keeps no global state: the workflow, judge and session factory are injected,
so the same object can later live inside a Ray actor.

Sync workflows: a `Workflow.execute` written as a plain `def` runs in one of the runner's
worker threads. A thread cannot be killed: when such an episode times out, the episode is
marked `timeout`, its handle is closed (further model calls from that thread fail) and the
thread is abandoned until its code returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ajet.config.schema import RolloutConfig
from ajet.errors import BadOutputError, InfrastructureError
from ajet.judge.base import Judge
from ajet.rollout.agent_metrics import count_tool_calls
from ajet.rollout.episode import FAILED, OK, TIMEOUT, Episode
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask

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
        self._executor: ThreadPoolExecutor | None = None

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
        """Release the worker threads of sync workflows (abandoned ones finish on their own)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

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
            result = await self._execute_with_timeout(episode.task, handle.tuner)
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

    async def _execute_with_timeout(self, task: WorkflowTask, tuner: Any) -> Any:
        async def guarded() -> Any:
            try:
                return await self._execute(task, tuner)
            except Exception as exc:  # noqa: BLE001 - carried out and classified by the caller
                return _Raised(exc)

        try:
            return await asyncio.wait_for(guarded(), timeout=self.config.episode_timeout_s)
        except asyncio.TimeoutError:
            return TIMEOUT

    async def _execute(self, task: WorkflowTask, tuner: Any) -> Any:
        if not self._sync_execute:
            return await self.workflow.execute(task, tuner)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.config.max_concurrency, thread_name_prefix="ajet-workflow"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.workflow.execute, task, tuner)

    def _record_workflow_error(self, episode: Episode, exc: BaseException) -> None:
        if isinstance(exc, BadOutputError):
            _fail(episode, "bad_output", exc, with_traceback=False)
        else:
            _fail(episode, f"workflow_error:{type(exc).__name__}", exc)
        self._log_failure(episode, exc)

    # ------------------------------------------------------------------ reward

    async def _score(self, episode: Episode, output: Any) -> None:
        if not isinstance(output, WorkflowOutput):
            episode.status, episode.reason = FAILED, "bad_output"
            episode.error_message = (
                f"execute returned {type(output).__name__}, not a WorkflowOutput; "
                "return WorkflowOutput(reward=...) (or reward=None to let the judge score it)"
            )
            self._log_failure(episode, None)
            return
        episode.output = output
        if output.reward is not None:
            reward, success = float(output.reward), output.is_success
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
        if isinstance(verdict, tuple | list) and len(verdict) == 2:
            return float(verdict[0]), (None if verdict[1] is None else bool(verdict[1]))
        if isinstance(verdict, int | float) and not isinstance(verdict, bool):
            return float(verdict), None
        episode.status, episode.reason = FAILED, "judge_error:bad_return"
        episode.error_message = (
            f"{type(judge).__name__} returned {verdict!r:.80}; expected (reward, is_success)"
        )
        self._log_failure(episode, None)
        return None

    # ------------------------------------------------------------------ bookkeeping

    def _collect_tracker(self, episode: Episode, tracker: Any) -> None:
        if tracker is None:
            return
        try:
            episode.num_calls = len(tracker.calls)
            episode.tool_calls, episode.valid_tool_calls = count_tool_calls(tracker.calls)
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

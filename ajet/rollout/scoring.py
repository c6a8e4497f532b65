"""How an episode's ending becomes its record: the reward (the workflow's, or the judge's) and
the tracker's timelines.

Shared by the two places episodes end: `TaskRunner` (a Python workflow returned) and
`EpisodeBroker` (a remote client finished through the episode API). Both mutate the
`Episode` in place and never raise for a workflow's, judge's or tracker's fault: the episode is
marked failed with a machine-readable reason instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import numbers
import traceback
from typing import Any

from ajet.judge.base import answer_text
from ajet.judge.group_rank import GroupRankJudge, Trajectory
from ajet.rollout.agent_metrics import count_tool_calls
from ajet.rollout.episode import FAILED, OK, PENDING, TIMEOUT, Episode
from ajet.workflow import WorkflowOutput

logger = logging.getLogger(__name__)


async def score_episode(
    episode: Episode, output: Any, judge: Any, timeout_s: float, *, workflow: str = ""
) -> None:
    """Set `episode`'s output, reward, success and status from what the workflow returned.

    A `WorkflowOutput` with a finite reward keeps it; with `reward=None` the judge scores it
    (and the judge's verdict is written back into the output), or, for a group judge, the
    episode is left pending for its group's verdict (`ajet.rollout.group_judging`). Anything
    else, a NaN/inf reward included, fails the episode (`workflow` names the workflow in the message).
    """
    if not isinstance(output, WorkflowOutput):
        bad_output(episode, (
            f"execute returned {type(output).__name__}, not a WorkflowOutput; "
            "return WorkflowOutput(reward=...) (or reward=None to let the judge score it)"
        ), workflow=workflow)
        return
    episode.output = output
    if output.reward is not None:
        reward, success = float(output.reward), output.is_success
        if not math.isfinite(reward):  # assigned past validation (e.g. model_construct)
            bad_output(episode, f"reward={reward!r}: a reward must be a finite number",
                       workflow=workflow)
            return
    elif judge is None:
        episode.status, episode.reason = FAILED, "no_reward"
        episode.error_message = (
            "the workflow returned reward=None and no judge is configured; return "
            "WorkflowOutput(reward=...) or set judge.type (e.g. judge.type=math)"
        )
        log_failure(episode, None)
        return
    elif isinstance(judge, GroupRankJudge):
        episode.status = PENDING  # scored with its group once every episode of it has ended
        return
    else:
        judged = await _judge(episode, output, judge, timeout_s)
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
    episode: Episode, output: WorkflowOutput, judge: Any, timeout_s: float
) -> tuple[float, bool | None] | None:
    """The judge's (reward, is_success), or None after marking the episode failed."""
    try:
        if hasattr(judge, "acompute_reward"):
            call = judge.acompute_reward(episode.task, output)
        else:
            # Called on the loop thread: math judges may rely on signal-based timeouts.
            call = maybe_await(judge.compute_reward(episode.task, output))
        verdict = await asyncio.wait_for(call, timeout=timeout_s)
    except asyncio.TimeoutError:
        episode.status, episode.reason = TIMEOUT, "judge_timeout"
        episode.error_message = f"the judge ran longer than {timeout_s}s"
        log_failure(episode, None)
        return None
    except Exception as exc:  # noqa: BLE001 - any judge failure fails this episode only
        fail(episode, f"judge_error:{type(exc).__name__}", exc)
        log_failure(episode, exc)
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
    log_failure(episode, None)
    return None


def _as_verdict(verdict: Any) -> tuple[float, bool | None] | None:
    """A judge's return value as (reward, is_success), or None when it is neither a number
    nor a pair. Strings are refused (no silent "0.7" -> 0.7), as in `WorkflowOutput`."""
    reward, success = (verdict if isinstance(verdict, tuple | list) and len(verdict) == 2
                       else (verdict, None))
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
        return None
    return float(reward), (None if success is None else bool(success))


def bad_output(episode: Episode, what: str, *, workflow: str = "") -> None:
    """Fail the episode as `bad_output`; the message names the workflow and the task."""
    episode.status, episode.reason = FAILED, "bad_output"
    source = f"workflow {workflow!r}, " if workflow else ""
    episode.error_message = f"{what} ({source}task {episode.task.task_id!r})"
    log_failure(episode, None)


def collect_tracker(episode: Episode, tracker: Any) -> None:
    """Copy the tracker's call count, tool-call counts, stats and policy versions into `episode`, and its timelines
    when the episode is ok or pending (a failed episode is never trained on); for a pending one,
    also what its group judge will see."""
    if tracker is None:
        return
    try:
        calls = list(tracker.calls)
        episode.num_calls = len(calls)
        episode.tool_calls, episode.valid_tool_calls = count_tool_calls(calls)
        episode.offered_tools = any(getattr(c, "tools", None) for c in calls)
        episode.truncated = bool(calls) and getattr(calls[-1], "finish_reason", "") == "length"
        episode.policy_versions = sorted({int(c.policy_version) for c in calls
                                          if getattr(c, "policy_version", None) is not None})
        stats = tracker.stats()
        episode.tracker_stats = (
            dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)
        )
        if episode.status in (OK, PENDING):
            episode.timelines = list(tracker.timelines())
        if episode.status == PENDING:
            episode.trajectory = Trajectory.from_calls(calls, answer_text(episode.output) if episode.output else "")
    except Exception as exc:  # noqa: BLE001 - a broken tracker fails this episode only
        if episode.status in (OK, PENDING):
            fail(episode, f"tracker_error:{type(exc).__name__}", exc)
            log_failure(episode, exc)
        else:
            logger.debug("episode %s: tracker unreadable after failure: %s", episode.episode_id, exc)


def fail(episode: Episode, reason: str, exc: BaseException, *, with_traceback: bool = True) -> None:
    episode.status, episode.reason = FAILED, reason
    if with_traceback:
        episode.error_message = "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        )
    else:
        episode.error_message = str(exc)


def log_failure(episode: Episode, exc: BaseException | None) -> None:
    detail = summary(exc) if exc is not None else episode.error_message
    logger.warning(
        "episode %s (task %s) %s: %s [%s]",
        episode.episode_id,
        episode.task.task_id,
        episode.status,
        episode.reason,
        detail,
    )


def summary(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def close_handle(handle: Any, episode_id: str) -> None:
    """Close an episode's session (its keys die); a failing close is logged, never raised."""
    try:
        await maybe_await(handle.close())
    except Exception as exc:  # noqa: BLE001 - a failing close must not hide the episode's result
        logger.warning("episode %s: closing its session failed: %s", episode_id, summary(exc))

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
import statistics
import traceback
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ajet.judge.base import answer_text
from ajet.judge.group_rank import GroupRankJudge, Trajectory
from ajet.rollout.agent_metrics import count_tool_calls
from ajet.rollout.episode import FAILED, OK, PENDING, TIMEOUT, Episode
from ajet.workflow import WorkflowOutput

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EpisodeRoles:
    """The roles one episode knows, to check a per-role reward against: `known` (called the
    model, registered with the tuner, or declared trainable) and `trained` (made a call whose
    completion is trained)."""

    known: frozenset[str]
    trained: frozenset[str]


def episode_roles(handle: Any, also: Iterable[str] = ()) -> EpisodeRoles:
    """What the episode's tracker and tuner know about its roles (`also`: roles the caller
    knows of, e.g. the role `ajet serve` hands out keys for)."""
    # Duck-typed like `collect_tracker`: other trackers and tuners (test doubles) may lack fields.
    calls = list(getattr(handle.tracker, "calls", None) or [])
    registered = getattr(handle.tuner, "registered_roles", None)
    known = {getattr(c, "role", "default") for c in calls} | set(registered() if callable(registered) else ())
    trained = {getattr(c, "role", "default") for c in calls
               if getattr(c, "trainable", True) and getattr(c, "completion_ids", None)}
    return EpisodeRoles(frozenset(known | set(also)), frozenset(trained))


async def score_episode(
    episode: Episode, output: Any, judge: Any, timeout_s: float, *, workflow: str = "",
    roles: EpisodeRoles | None = None,
) -> None:
    """Set `episode`'s output, reward, success and status from what the workflow returned.

    A `WorkflowOutput` with a finite reward keeps it; with `reward=None` the judge scores it
    (and the judge's verdict is written back into the output), or, for a group judge, the
    episode is left pending for its group's verdict (`ajet.rollout.group_judging`). Anything
    else, a NaN/inf reward included, fails the episode (`workflow` names the workflow in the message).

    A per-role reward (`{role: reward}`, from the workflow or the judge) sets
    `episode.role_rewards` and `episode.reward` = their mean; without an explicit `is_success`
    the episode succeeds when every role's reward reaches 1. With `roles`, a role the episode
    never registered, or a trained role without a reward, fails the episode (`bad_output`).
    """
    if not isinstance(output, WorkflowOutput):
        bad_output(episode, (
            f"execute returned {type(output).__name__}, not a WorkflowOutput; "
            "return WorkflowOutput(reward=...) (or reward=None to let the judge score it)"
        ), workflow=workflow)
        return
    episode.output = output
    if output.reward is not None:
        reward, success = output.reward, output.is_success
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
    if _set_reward(episode, reward, success, roles, workflow):
        episode.status = OK


def _set_reward(episode: Episode, reward: Any, success: bool | None, roles: EpisodeRoles | None,
                workflow: str) -> bool:
    """Set the episode's reward, per-role rewards and success; False after failing it."""
    values = reward if isinstance(reward, Mapping) else {"": reward}
    if not all(math.isfinite(float(v)) for v in values.values()):  # assigned past validation (model_construct)
        bad_output(episode, f"reward={reward!r}: a reward must be a finite number", workflow=workflow)
        return False
    if isinstance(reward, Mapping):
        problem = role_reward_problem(reward, roles, has_step_rewards=bool(episode.output and episode.output.step_rewards))
        if problem:
            bad_output(episode, problem, workflow=workflow)
            return False
        episode.role_rewards = {str(role): float(value) for role, value in reward.items()}
        episode.reward = statistics.fmean(episode.role_rewards.values())
        reached = all(value >= 1.0 for value in episode.role_rewards.values())
    else:
        episode.reward = float(reward)
        reached = episode.reward >= 1.0
    # No explicit verdict: a reward at the top of the usual 0..1 scale counts as a success
    # (partial credit such as 0.2 for a near miss does not); per role, every role's must.
    episode.is_success = bool(success) if success is not None else reached
    return True


def role_reward_problem(reward: Mapping[str, Any], roles: EpisodeRoles | None, *,
                        has_step_rewards: bool = False) -> str:
    """Why a per-role reward cannot be trained on ("" when it can). Pure.

    A role the episode never registered is most often a typo, and its reward would train no
    samples; a trained role without a reward would leave its samples without an advantage."""
    if has_step_rewards:
        return ("a per-role reward cannot be combined with step_rewards (one value per call, in call "
                "order, for the whole episode); return one of the two")
    if roles is None:
        return ""
    unknown = sorted(set(reward) - roles.known)
    if unknown:
        return (f"the reward names role(s) {unknown} that this episode never registered (its roles: "
                f"{sorted(roles.known)}); a per-role reward is for roles that called the model or were "
                "registered (tuner.register_model(role), trainable_targets): fix the role name or register it")
    missing = sorted(roles.trained - set(reward))
    if missing:
        return (f"the reward has no entry for role(s) {missing}, whose calls are trained (rewarded roles: "
                f"{sorted(reward)}); give every trained role a reward, or leave it out of trainable_targets")
    return ""


async def _judge(
    episode: Episode, output: WorkflowOutput, judge: Any, timeout_s: float
) -> tuple[float | dict[str, float], bool | None] | None:
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
    if judged is not None and _finite(judged[0]):
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


def _as_verdict(verdict: Any) -> tuple[float | dict[str, float], bool | None] | None:
    """A judge's return value as (reward, is_success), or None when it is neither a reward
    nor a pair. A reward is a number or a non-empty {role: number} dict. Strings are refused
    (no silent "0.7" -> 0.7), as in `WorkflowOutput`."""
    reward, success = (verdict if isinstance(verdict, tuple | list) and len(verdict) == 2
                       else (verdict, None))
    success = None if success is None else bool(success)
    if isinstance(reward, Mapping):
        if not reward or not all(isinstance(k, str) and k and _is_number(v) for k, v in reward.items()):
            return None
        return {k: float(v) for k, v in reward.items()}, success
    if not _is_number(reward):
        return None
    return float(reward), success


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _finite(reward: float | Mapping[str, float]) -> bool:
    values = reward.values() if isinstance(reward, Mapping) else [reward]
    return all(math.isfinite(v) for v in values)


def bad_output(episode: Episode, what: str, *, workflow: str = "") -> None:
    """Fail the episode as `bad_output`; the message names the workflow and the task."""
    episode.status, episode.reason = FAILED, "bad_output"
    source = f"workflow {workflow!r}, " if workflow else ""
    episode.error_message = f"{what} ({source}task {episode.task.task_id!r})"
    log_failure(episode, None)


def collect_refusals(episode: Episode, handle: Any) -> None:
    """The calls the episode's session refused, by field (`gateway/refused/<field>`); none for a
    handle without a session (duck-typed like `collect_tracker`: test doubles and other factories
    may have none)."""
    refusals = getattr(getattr(handle, "session", None), "refusals", None)
    episode.refused = dict(refusals()) if callable(refusals) else {}


def collect_tracker(episode: Episode, tracker: Any) -> None:
    """Copy the tracker's call count, tool-call counts, stats and policy versions into `episode`, and its timelines
    when the episode is ok or pending (a failed episode is never trained on); for a pending one,
    also what its group judge will see."""
    if tracker is None:
        return
    try:
        calls = list(tracker.calls)
        episode.num_calls = len(calls)
        episode.role_calls = dict(Counter(getattr(c, "role", "default") for c in calls))
        tokens: Counter[str] = Counter()
        for c in calls:
            tokens[getattr(c, "role", "default")] += len(getattr(c, "completion_ids", None) or ())
        episode.role_tokens = dict(tokens)
        episode.tool_calls, episode.valid_tool_calls = count_tool_calls(calls)
        episode.offered_tools = any(getattr(c, "tools", None) for c in calls)
        episode.truncated = bool(calls) and getattr(calls[-1], "finish_reason", "") == "length"
        episode.policy_versions = sorted({int(c.policy_version) for c in calls
                                          if getattr(c, "policy_version", None) is not None})
        stats = tracker.stats()
        episode.tracker_stats = (
            dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) and not isinstance(stats, type) else dict(stats)
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

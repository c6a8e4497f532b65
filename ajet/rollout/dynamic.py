"""Dynamic sampling: a training batch of groups that all carry a learning signal.

A GRPO group whose episodes all got the same reward (all fail, or all succeed) has zero
advantages: it costs a rollout and teaches nothing. With per-role rewards (multi-agent,
self-play) a group has signal when any role's rewards differ across its episodes, since each
role's advantages come from its own rewards (`ajet.rollout.roles.has_signal`): a zero-sum game
whose mean reward never moves still teaches both sides. Early in training, when successes are
rare, most groups are like that and most steps learn nothing. Dynamic sampling (DAPO, Yu et
al. 2025) drops such groups and refills the batch by rolling out more tasks, up to a cap.

`sample_with_signal` is the whole loop; it knows nothing about engines or trainers. It takes
`rollout(tasks, round_index) -> episodes` (round 0 is the step's ordinary rollout) and
`next_tasks(k) -> k tasks` (the task reader), and returns a `RolloutResult` whose
`ok_episodes` are at most `batch_size` kept groups, plus `dynamic/*` metrics:

| metric | meaning |
|---|---|
| `dynamic/rounds` | rollout rounds this step (1 = no refill was needed or allowed) |
| `dynamic/tasks` | tasks rolled out this step |
| `dynamic/kept_groups` | groups trained on (<= batch_size) |
| `dynamic/dropped_groups` | groups without signal (equal rewards, every role's with per-role rewards, or < 2 ok episodes) |
| `dynamic/surplus_groups` | groups with signal beyond batch_size (rolled out, not trained) |
| `dynamic/episodes_per_kept_group` | episodes rolled out per kept group (absent when none was kept) |

Each refill round asks for the groups still missing divided by the keep rate seen so far
(at most `batch_size` tasks, and never past `batch_size * max_rounds` in all), so one more
round usually suffices. When the cap is reached the step trains on what it has.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ajet.rollout.episode import OK, Episode
from ajet.rollout.manager import RolloutResult, by_group, drop_equal_reward_groups
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)

RolloutFn = Callable[[list[WorkflowTask], int], Awaitable[Any]]  # -> RolloutResult | list[Episode]
TaskSource = Callable[[int], list[WorkflowTask]]


async def sample_with_signal(
    rollout: RolloutFn, next_tasks: TaskSource, *, batch_size: int, max_rounds: int
) -> tuple[RolloutResult, dict[str, float]]:
    """Roll out until `batch_size` groups have unequal rewards, or the cap is reached.

    Returns the result (all episodes of every round in `episodes`; the kept groups' ok
    episodes in `ok_episodes`, in the order their groups were kept; the rounds' own
    `extra_metrics`, such as the group judge's `judge/group_*` counts, summed) and the
    `dynamic/*` metrics.
    """
    if batch_size < 1 or max_rounds < 1:
        raise ValueError(f"batch_size and max_rounds must be >= 1, got {batch_size} and {max_rounds}")
    budget = batch_size * max_rounds
    episodes: list[Episode] = []
    kept: dict[str, list[Episode]] = {}  # group id -> its ok episodes, in keep order
    dropped: list[str] = []
    surplus = sampled = rounds = max_in_flight = 0
    summed: dict[str, float] = {}  # the rounds' own metrics (e.g. the group judge's cost), summed
    request = batch_size
    while request > 0:
        tasks = next_tasks(request)
        if not tasks:
            break
        round_episodes, in_flight, round_metrics = _episodes_of(await rollout(tasks, rounds))
        for key, value in round_metrics.items():
            summed[key] = summed.get(key, 0.0) + value
        rounds += 1
        sampled += len(tasks)
        max_in_flight = max(max_in_flight, in_flight)
        episodes.extend(round_episodes)
        with_signal, no_signal = _split_groups(round_episodes)
        dropped.extend(no_signal)
        for group_id, group in with_signal.items():
            if len(kept) < batch_size and group_id not in kept:
                kept[group_id] = group
            else:
                surplus += 1
        request = _next_request(batch_size - len(kept), len(kept), sampled, budget - sampled, batch_size)
    if len(kept) < batch_size:
        logger.info("dynamic sampling: %d of %d groups with signal after %d tasks (cap %d)",
                    len(kept), batch_size, sampled, budget)
    result = RolloutResult(
        episodes=episodes, ok_episodes=[e for group in kept.values() for e in group],
        dropped_groups=dropped, max_in_flight=max_in_flight, extra_metrics=summed,
    )
    return result, signal_metrics(rounds=rounds, tasks=sampled, kept=len(kept), dropped=len(dropped),
                                  surplus=surplus, episodes=len(episodes))


def signal_metrics(*, rounds: int, tasks: int, kept: int, dropped: int, surplus: int, episodes: int) -> dict[str, float]:
    """The `dynamic/*` metrics of one step (the table above), wherever its groups were sampled."""
    metrics = {
        "dynamic/rounds": float(rounds),
        "dynamic/tasks": float(tasks),
        "dynamic/kept_groups": float(kept),
        "dynamic/dropped_groups": float(dropped),
        "dynamic/surplus_groups": float(surplus),
    }
    if kept:
        metrics["dynamic/episodes_per_kept_group"] = episodes / kept
    return metrics


def _next_request(missing: int, kept: int, sampled: int, left: int, batch_size: int) -> int:
    """Tasks for the next round: the missing groups over the keep rate so far, capped."""
    if missing <= 0 or left <= 0:
        return 0
    wanted = batch_size if kept == 0 else math.ceil(missing * sampled / kept)
    return min(wanted, batch_size, left)


def _episodes_of(result: Any) -> tuple[list[Episode], int, dict[str, float]]:
    if isinstance(result, RolloutResult):
        return list(result.episodes), result.max_in_flight, dict(result.extra_metrics)
    return list(result), 0, {}


def _split_groups(episodes: Sequence[Episode]) -> tuple[dict[str, list[Episode]], list[str]]:
    """(group id -> ok episodes of the groups with signal, ids of the groups without).

    A group with signal has >= 2 ok episodes whose rewards differ, for some role with per-role
    rewards (failed episodes are not trained on, so they neither give nor take signal)."""
    ok = [e for e in episodes if e.status == OK]
    kept, no_signal = drop_equal_reward_groups(ok)
    all_groups = list(dict.fromkeys(e.group_id for e in episodes))
    groups = by_group(kept)
    no_signal_set = set(no_signal)
    without_ok = [g for g in all_groups if g not in groups and g not in no_signal_set]
    return groups, [*no_signal, *without_ok]

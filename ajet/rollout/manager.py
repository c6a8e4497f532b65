"""RolloutManager: run every task `n` times, concurrently and bounded, and summarise the step.

One failing or hanging episode never takes the step down: the runner turns every ending
into an `Episode`, and the result counts the failures by reason.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from ajet.config.schema import RolloutConfig
from ajet.judge.group_rank import GroupRankJudge
from ajet.rollout.agent_metrics import agent_metrics
from ajet.rollout.episode import FAILED, OK, TIMEOUT, Episode
from ajet.rollout.group_judging import GroupJudging
from ajet.rollout.roles import has_signal, role_metrics
from ajet.rollout.runner import TaskRunner
from ajet.rollout.sync_threads import use_daemon_default_executor
from ajet.rollout.watchdog import LoopWatchdog
from ajet.workflow import WorkflowTask

logger = logging.getLogger(__name__)


@dataclass
class RolloutResult:
    """All episodes of one rollout, and the ones to train on.

    `ok_episodes`: status "ok", minus the groups dropped because all their rewards were
    equal (only when `rollout.drop_equal_reward_groups`).
    """

    episodes: list[Episode]
    ok_episodes: list[Episode]
    dropped_groups: list[str] = field(default_factory=list)
    max_in_flight: int = 0
    # log_metrics keys already warned about for a NaN/inf value: shared by the manager's
    # results, so a run warns once per key rather than once per step.
    warned_keys: set[str] = field(default_factory=set, repr=False)
    # Metrics of the episode source itself (e.g. the remote broker's `remote/*`), logged as is.
    extra_metrics: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat metrics for the step (see docs/outputs.md).

        `rollout/failed` counts every episode that is not ok (timeouts included);
        `rollout/failed/<reason>` breaks it down (a timeout's reason is "timeout").
        `rollout/truncated_rate`: episodes whose last call was cut at its token limit / episodes.
        `reward/zero_std_frac`: groups whose ok episodes all got the same reward / groups (before
        dropping groups; such a group has zero advantages). `success/all_group_frac` and
        `success/none_group_frac`: groups whose ok episodes all succeeded / none did, over groups
        (why a group has no signal: too easy or too hard). With per-role rewards a group counts
        as equal only when every role's rewards are (`ajet.rollout.roles.has_signal`), and
        `reward/*` are over `Episode.reward`, the mean over the roles; `role/<name>/*` are per role.
        `reward/*`, `success/rate`, `workflow/*` and `judge/*` average over the ok episodes
        (before dropping groups) and are absent when there are none. `agent/*` (tool use,
        `ajet.rollout.agent_metrics`) counts every episode, a failed one as no success.
        """
        episodes = self.episodes
        ok = [e for e in episodes if e.status == OK]
        not_ok = [e for e in episodes if e.status != OK]
        out: dict[str, float] = {
            "rollout/episodes": float(len(episodes)),
            "rollout/ok": float(len(ok)),
            "rollout/failed": float(len(not_ok)),
            "rollout/timeouts": float(sum(e.status == TIMEOUT for e in episodes)),
            "rollout/retries": float(sum(e.retries for e in episodes)),
            "rollout/dropped_groups": float(len(self.dropped_groups)),
            "rollout/max_in_flight": float(self.max_in_flight),
            "rollout/dropped_log_metrics": 0.0,
        }
        for reason, count in Counter(e.reason for e in not_ok).items():
            out[f"rollout/failed/{reason}"] = float(count)
        if episodes:
            out["rollout/episode_time_s"] = statistics.fmean(e.duration_s for e in episodes)
            out["rollout/truncated_rate"] = statistics.fmean(float(e.truncated) for e in episodes)
        if ok:
            rewards = [e.reward for e in ok]
            out["reward/mean"] = statistics.fmean(rewards)
            out["reward/std"] = statistics.pstdev(rewards)
            out["reward/zero_std_frac"] = zero_std_frac(ok)
            out["success/all_group_frac"], out["success/none_group_frac"] = settled_group_fracs(ok)
            out["success/rate"] = statistics.fmean(float(e.is_success) for e in ok)
            out["rollout/calls_per_episode"] = statistics.fmean(e.num_calls for e in ok)
            out.update(role_metrics(ok))
            out.update(mean_log_metrics(ok, self.warned_keys))
        out.update(agent_metrics(episodes))
        out.update(self.extra_metrics)
        return out


# The `log_metrics` namespaces that keep their names (the judge's breakdown, the sandbox's counts);
# every other key is the workflow's own. `ajet serve` refuses them from clients (`EpisodeBroker`).
KEPT_METRIC_PREFIXES = ("judge/", "sandbox/")


def mean_log_metrics(episodes: list[Episode], warned: set[str]) -> dict[str, float]:
    """Mean of each `log_metrics` key over the episodes that report it. Judge breakdowns
    (`judge/<component>`) and the sandbox's counts (`sandbox/timeouts`, ...: a
    `SandboxSession.metrics()`, per episode) keep their name; the workflow's own get the
    `workflow/` prefix.

    A NaN/inf value is left out of its mean (one would poison it) and counted in
    `rollout/dropped_log_metrics`; the first time a key (not yet in `warned`) does so, a
    warning names it.
    """
    values: dict[str, list[float]] = defaultdict(list)
    dropped = 0
    for e in episodes:
        for key, value in (e.output.log_metrics if e.output else {}).items():
            name = key if key.startswith(KEPT_METRIC_PREFIXES) else f"workflow/{key}"
            if math.isfinite(value):
                values[name].append(float(value))
                continue
            dropped += 1
            if name not in warned:
                warned.add(name)
                logger.warning(
                    "log_metrics[%r] = %r in episode %s (task %s): not a finite number, left out "
                    "of %s; counted in rollout/dropped_log_metrics (warned once per key)",
                    key, value, e.episode_id, e.task.task_id, name,
                )
    out = {name: statistics.fmean(v) for name, v in values.items()}
    out["rollout/dropped_log_metrics"] = float(dropped)
    return out


def by_group(episodes: list[Episode]) -> dict[str, list[Episode]]:
    """The episodes by their group id, in order."""
    groups: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        groups[e.group_id].append(e)
    return dict(groups)


def zero_std_frac(episodes: list[Episode]) -> float:
    """The share of groups (of these episodes) whose rewards are all equal: no GRPO signal
    (with per-role rewards: every role's rewards equal, `has_signal`)."""
    groups = by_group(episodes)
    equal = sum(not has_signal(group) for group in groups.values())
    return equal / len(groups) if groups else 0.0


def settled_group_fracs(episodes: list[Episode]) -> tuple[float, float]:
    """The shares of groups (of these episodes) whose episodes all succeeded and none did."""
    groups = by_group(episodes)
    if not groups:
        return 0.0, 0.0
    return (sum(all(e.is_success for e in g) for g in groups.values()) / len(groups),
            sum(not any(e.is_success for e in g) for g in groups.values()) / len(groups))


def drop_equal_reward_groups(episodes: list[Episode]) -> tuple[list[Episode], list[str]]:
    """Remove the groups whose ok episodes all have the same reward (no GRPO signal); with
    per-role rewards a group is kept when any role's rewards differ (`has_signal`).

    Returns the kept episodes (order preserved) and the dropped group ids.
    """
    dropped = [g for g, group in by_group(episodes).items() if not has_signal(group)]
    dropped_set = set(dropped)
    return [e for e in episodes if e.group_id not in dropped_set], dropped


class RolloutManager:
    def __init__(self, runner: TaskRunner, config: RolloutConfig) -> None:
        self.runner = runner
        self.config = config
        self._warned_keys: set[str] = set()
        self._first_reported = False  # the run's first ended episode is logged as it ends

    def _report_first(self, episode: Episode) -> None:
        """One line for the first episode that ends, at once: not only at the end of the step."""
        if self._first_reported:
            return
        self._first_reported = True
        verdict = f"reward {episode.reward:.3f}" if episode.status == OK else f"{episode.reason}"
        logger.info("first episode %s (task %s): %s, %s, %d calls, %.1f s (`ajet episode --conf ...` "
                    "shows one in full)", episode.episode_id, episode.task.task_id, episode.status, verdict,
                    episode.num_calls, episode.duration_s)

    async def rollout(
        self, tasks: list[WorkflowTask], n: int | None = None, *, episode_prefix: str = ""
    ) -> RolloutResult:
        """Run every task `n` times (default `rollout.n`), at most `max_concurrency` at once.

        Episode ids are `f"{episode_prefix}{task_id}-e{i}"` (e.g. prefix "s3-" for step 3);
        a task id repeated in `tasks` continues the numbering, so ids stay unique. The group
        id is the task id. With a group judge (judge.type=group_rank) each group is scored as
        soon as its episodes have ended; a group it fails to score is dropped.
        """
        n = self.config.n if n is None else n
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        # `asyncio.to_thread` in a workflow (and ajet's own prompt building) must not leave a
        # thread the interpreter joins at exit: a call that never returns would hold the run.
        use_daemon_default_executor(asyncio.get_running_loop())
        semaphore = asyncio.Semaphore(self.config.max_concurrency)
        in_flight = 0
        max_in_flight = 0

        async def one(task: WorkflowTask, episode_id: str) -> Episode:
            nonlocal in_flight, max_in_flight
            async with semaphore:
                in_flight += 1
                max_in_flight = max(max_in_flight, in_flight)
                try:
                    episode = await self.runner.run_episode(task, episode_id, group_id=task.task_id)
                    self._report_first(episode)
                    return episode
                finally:
                    in_flight -= 1

        jobs = [
            (task.task_id, one(task, episode_id)) for task, episode_id in _episode_ids(tasks, n, episode_prefix)
        ]
        judge = getattr(self.runner, "judge", None)
        judging = GroupJudging(judge, self.config.episode_timeout_s) if isinstance(judge, GroupRankJudge) else None
        watchdog = None
        if self.config.blocked_loop_warn_s > 0:
            watchdog = LoopWatchdog(asyncio.get_running_loop(), threshold_s=self.config.blocked_loop_warn_s)
            watchdog.start()
        try:
            episodes = await _run_groups(jobs, judging)
        finally:
            if watchdog is not None:
                watchdog.stop()
        ok = [e for e in episodes if e.status == OK]
        dropped: list[str] = list(judging.failed_groups) if judging else []
        if self.config.drop_equal_reward_groups:
            ok, no_signal = drop_equal_reward_groups(ok)
            dropped += no_signal
        failed = sum(e.status == FAILED for e in episodes)
        timeouts = sum(e.status == TIMEOUT for e in episodes)
        if failed or timeouts:
            logger.info(
                "rollout: %d episodes, %d failed, %d timed out", len(episodes), failed, timeouts
            )
        return RolloutResult(
            episodes=episodes, ok_episodes=ok, dropped_groups=dropped,
            max_in_flight=max_in_flight, warned_keys=self._warned_keys,
            extra_metrics=judging.metrics() if judging else {},
        )


async def _run_groups(jobs: Sequence[tuple[str, Awaitable[Episode]]], judging: GroupJudging | None) -> list[Episode]:
    """Run (group id, episode) jobs; the episodes in job order. With `judging`, each group is
    scored as soon as its own episodes have ended, while the others still run."""
    futures = [asyncio.ensure_future(job) for _, job in jobs]  # started in job order either way
    if judging is not None:
        groups: dict[str, list[asyncio.Future[Episode]]] = defaultdict(list)
        for (group_id, _), future in zip(jobs, futures, strict=True):
            groups[group_id].append(future)

        async def judged(members: list[asyncio.Future[Episode]]) -> None:
            await judging.score(list(await asyncio.gather(*members)))

        await asyncio.gather(*(judged(members) for members in groups.values()))
    return list(await asyncio.gather(*futures))


def _episode_ids(tasks: list[WorkflowTask], n: int, prefix: str) -> list[tuple[WorkflowTask, str]]:
    seen: Counter[str] = Counter()
    pairs: list[tuple[WorkflowTask, str]] = []
    for task in tasks:
        start = seen[task.task_id]
        seen[task.task_id] += n
        pairs.extend((task, f"{prefix}{task.task_id}-e{start + i}") for i in range(n))
    return pairs

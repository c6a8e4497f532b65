"""RolloutManager: tasks × n episodes, bounded concurrency, failures counted, metrics."""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass, field
from typing import Any

import pytest

from ajet.config.schema import RolloutConfig
from ajet.rollout.episode import Episode
from ajet.rollout.manager import RolloutManager, drop_equal_reward_groups
from ajet.rollout.runner import TaskRunner
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask


@dataclass
class Tracker:
    calls: list[int] = field(default_factory=list)

    def timelines(self) -> list[int]:
        return list(self.calls)

    def stats(self) -> dict[str, int]:
        return {"calls": len(self.calls)}


@dataclass
class Tuner:
    episode_id: str
    tracker: Tracker


@dataclass
class Handle:
    tuner: Any
    tracker: Tracker
    closed: bool = False

    def close(self) -> None:
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.handles: dict[str, list[Handle]] = {}

    async def open_episode(self, episode_id: str, task: WorkflowTask) -> Handle:  # async is allowed
        tracker = Tracker()
        handle = Handle(tuner=Tuner(episode_id, tracker), tracker=tracker)
        self.handles.setdefault(episode_id, []).append(handle)
        return handle


def reward_of(episode_id: str) -> float:
    """A deterministic, varied reward per episode."""
    return (sum(map(ord, episode_id)) % 5) / 4


class MixedWorkflow(Workflow):
    """Raises in ~30% of episodes, hangs in one, otherwise returns a reward; measures concurrency."""

    hang_id: str = ""

    def model_post_init(self, context: Any) -> None:
        self._in_flight = 0
        self._max_in_flight = 0

    async def execute(self, task: WorkflowTask, tuner: Tuner) -> WorkflowOutput:
        episode_id = tuner.episode_id
        self._in_flight += 1
        self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            await asyncio.sleep(0.01)
            tuner.tracker.calls.append(1)
            if episode_id == self.hang_id:
                await asyncio.sleep(60)
            if int(episode_id.rsplit("e", 1)[1]) % 10 in (1, 4, 7):
                raise ValueError(f"parse failure in {episode_id}")
            return WorkflowOutput(reward=reward_of(episode_id), log_metrics={"turns": 2.0})
        finally:
            self._in_flight -= 1


def make_tasks(count: int) -> list[WorkflowTask]:
    return [WorkflowTask(task_id=f"t{i}") for i in range(count)]


def test_failures_and_a_hang_do_not_take_the_step_down() -> None:
    n, count = 10, 3
    cfg = RolloutConfig(n=n, max_concurrency=4, episode_timeout_s=0.5, max_retries=2)
    workflow = MixedWorkflow(hang_id="t1-e5")
    factory = Factory()
    runner = TaskRunner(workflow, None, factory, cfg, backoff_s=0.001)
    result = asyncio.run(RolloutManager(runner, cfg).rollout(make_tasks(count)))

    assert len(result.episodes) == count * n
    by_id = {e.episode_id: e for e in result.episodes}
    assert set(by_id) == {f"t{i}-e{j}" for i in range(count) for j in range(n)}
    raised = {f"t{i}-e{j}" for i in range(count) for j in (1, 4, 7)}
    assert {e.episode_id for e in result.episodes if e.status == "failed"} == raised
    assert [e.episode_id for e in result.episodes if e.status == "timeout"] == ["t1-e5"]
    assert all(by_id[i].reason == "workflow_error:ValueError" for i in raised)
    ok = [e for e in result.episodes if e.status == "ok"]
    assert result.ok_episodes == ok and len(ok) == count * n - len(raised) - 1
    assert all(e.reward == reward_of(e.episode_id) and e.group_id == e.task.task_id for e in ok)
    assert all(h.closed for hs in factory.handles.values() for h in hs)

    # Concurrency: bounded by max_concurrency and actually reached (measured in the workflow).
    assert workflow._max_in_flight == 4 and result.max_in_flight == 4

    m = result.metrics()
    assert m["rollout/episodes"] == 30 and m["rollout/ok"] == len(ok)
    assert m["rollout/failed"] == len(raised) + 1
    assert m["rollout/failed/workflow_error:ValueError"] == len(raised)
    assert m["rollout/failed/timeout"] == 1 and m["rollout/timeouts"] == 1
    assert m["reward/mean"] == pytest.approx(statistics.fmean(reward_of(e.episode_id) for e in ok))
    assert m["reward/std"] == pytest.approx(statistics.pstdev(reward_of(e.episode_id) for e in ok))
    assert m["success/rate"] == pytest.approx(
        sum(reward_of(e.episode_id) >= 1.0 for e in ok) / len(ok)
    )
    assert m["workflow/turns"] == 2.0 and m["rollout/dropped_groups"] == 0
    assert m["rollout/calls_per_episode"] == 1.0


def test_concurrency_one_runs_episodes_one_at_a_time() -> None:
    cfg = RolloutConfig(n=3, max_concurrency=1, episode_timeout_s=5)
    workflow = MixedWorkflow()
    runner = TaskRunner(workflow, None, Factory(), cfg)
    result = asyncio.run(RolloutManager(runner, cfg).rollout(make_tasks(2)))
    assert workflow._max_in_flight == 1 and result.max_in_flight == 1
    assert len(result.episodes) == 6


class Constant(Workflow):
    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        reward = float(task.metadata.get("reward", 1.0))
        return WorkflowOutput(reward=reward, log_metrics=dict(task.metadata.get("log", {})))


def rollout(tasks: list[WorkflowTask], n: int | None = None, **kw: Any):
    cfg = RolloutConfig(**{"n": 2, "episode_timeout_s": 5, **kw})
    runner = TaskRunner(Constant(), None, Factory(), cfg)
    return asyncio.run(RolloutManager(runner, cfg).rollout(tasks, n))


def test_episode_ids_prefix_and_repeated_tasks() -> None:
    cfg = RolloutConfig(n=2, episode_timeout_s=5)
    runner = TaskRunner(Constant(), None, Factory(), cfg)
    tasks = [WorkflowTask(task_id="a"), WorkflowTask(task_id="b"), WorkflowTask(task_id="a")]
    result = asyncio.run(RolloutManager(runner, cfg).rollout(tasks, episode_prefix="s3-"))
    ids = [e.episode_id for e in result.episodes]
    assert ids == ["s3-a-e0", "s3-a-e1", "s3-b-e0", "s3-b-e1", "s3-a-e2", "s3-a-e3"]
    assert [e.group_id for e in result.episodes] == ["a", "a", "b", "b", "a", "a"]


def test_the_first_episode_to_end_is_logged_as_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 58: a run says how its first episode went at once, not only at the end of the step."""
    cfg = RolloutConfig(n=2, episode_timeout_s=5)
    manager = RolloutManager(TaskRunner(Constant(), None, Factory(), cfg), cfg)
    with caplog.at_level("INFO", logger="ajet.rollout.manager"):
        asyncio.run(manager.rollout(make_tasks(3), episode_prefix="s1-"))
        asyncio.run(manager.rollout(make_tasks(3), episode_prefix="s2-"))  # the run's next step
    firsts = [r.getMessage() for r in caplog.records if r.getMessage().startswith("first episode")]
    assert len(firsts) == 1 and firsts[0].startswith("first episode s1-t") and ": ok, reward " in firsts[0]
    assert "ajet episode" in firsts[0]


def test_n_overrides_the_config() -> None:
    result = rollout([WorkflowTask(task_id="a")], n=5)
    assert len(result.episodes) == 5
    with pytest.raises(ValueError, match="n must be >= 1"):
        rollout([WorkflowTask(task_id="a")], n=0)


def test_drop_equal_reward_groups_when_enabled() -> None:
    tasks = [
        WorkflowTask(task_id="same", metadata={"reward": 1.0}),
        WorkflowTask(task_id="varied", metadata={"reward": 0.0}),
        WorkflowTask(task_id="varied", metadata={"reward": 1.0}),
    ]
    kept = rollout(tasks, drop_equal_reward_groups=True)
    assert {e.group_id for e in kept.ok_episodes} == {"varied"} and len(kept.ok_episodes) == 4
    assert kept.dropped_groups == ["same"] and kept.metrics()["rollout/dropped_groups"] == 1
    assert len(kept.episodes) == 6  # dropped episodes are still reported
    off = rollout(tasks, drop_equal_reward_groups=False)
    assert len(off.ok_episodes) == 6 and off.dropped_groups == []


def ep(group: str, reward: float, i: int = 0) -> Episode:
    return Episode(
        episode_id=f"{group}-e{i}", task=WorkflowTask(task_id=group), group_id=group, reward=reward
    )


def test_drop_equal_reward_groups_pure() -> None:
    episodes = [ep("a", 1.0, 0), ep("b", 0.0, 0), ep("a", 1.0, 1), ep("b", 0.5, 1), ep("c", 0.3, 0)]
    kept, dropped = drop_equal_reward_groups(episodes)
    assert [e.episode_id for e in kept] == ["b-e0", "b-e1"]
    assert dropped == ["a", "c"]


def test_metrics_average_log_metrics_and_keep_judge_breakdown_names() -> None:
    tasks = [
        WorkflowTask(
            task_id="x", metadata={"reward": 1.0, "log": {"turns": 2, "judge/format": 1.0}}
        ),
        WorkflowTask(
            task_id="y", metadata={"reward": 0.0, "log": {"turns": 4, "judge/format": 0.0}}
        ),
    ]
    m = rollout(tasks, n=1).metrics()
    assert m["workflow/turns"] == 3.0 and m["judge/format"] == 0.5
    assert "workflow/judge/format" not in m
    assert m["reward/mean"] == 0.5 and m["reward/std"] == 0.5 and m["success/rate"] == 0.5


def test_metrics_without_ok_episodes_omit_reward() -> None:
    class Raises(Workflow):
        async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
            raise RuntimeError("always")

    cfg = RolloutConfig(n=2, episode_timeout_s=5)
    result = asyncio.run(
        RolloutManager(TaskRunner(Raises(), None, Factory(), cfg), cfg).rollout(
            [WorkflowTask(task_id="a")]
        )
    )
    m = result.metrics()
    assert m["rollout/failed"] == 2 and m["rollout/failed/workflow_error:RuntimeError"] == 2
    assert "reward/mean" not in m and result.ok_episodes == []

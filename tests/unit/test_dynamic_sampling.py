"""Dynamic sampling with a scripted rollout: which groups are kept, how many tasks are
sampled, the cap, and the episodes spent per kept group."""

from __future__ import annotations

import asyncio

import pytest

from ajet.rollout.dynamic import sample_with_signal
from ajet.rollout.episode import FAILED, OK, Episode
from ajet.rollout.manager import RolloutResult
from ajet.workflow import WorkflowTask

N = 4  # episodes per task


class Tasks:
    """A task source over named tasks; records the size of every request."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self.requests: list[int] = []

    def __call__(self, k: int) -> list[WorkflowTask]:
        self.requests.append(k)
        taken, self.names = self.names[:k], self.names[k:]
        return [WorkflowTask(task_id=name, main_query=name) for name in taken]


def scripted_rollout(rewards: dict[str, list[float]], rounds: list[int]):
    """Each task's episodes get the rewards listed for it (the letter "x" = a failed episode)."""

    async def rollout(tasks: list[WorkflowTask], round_index: int) -> RolloutResult:
        rounds.append(round_index)
        episodes = []
        for task in tasks:
            for i, r in enumerate(rewards[task.task_id]):
                status = FAILED if r == "x" else OK
                episodes.append(Episode(episode_id=f"{task.task_id}-e{i}", task=task, group_id=task.task_id,
                                        status=status, reward=0.0 if r == "x" else float(r)))
        return RolloutResult(episodes=episodes, ok_episodes=[e for e in episodes if e.ok], max_in_flight=3)

    return rollout


def run(rewards: dict[str, list[float]], order: list[str], batch_size: int, max_rounds: int):
    tasks, rounds = Tasks(order), []
    result, metrics = asyncio.run(sample_with_signal(
        scripted_rollout(rewards, rounds), tasks, batch_size=batch_size, max_rounds=max_rounds))
    return result, metrics, tasks.requests, rounds


SIGNAL, ZEROS, ONES = [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]


def test_a_full_first_round_needs_no_refill() -> None:
    rewards = {"a": SIGNAL, "b": [0, 1, 0, 1]}
    result, metrics, requests, rounds = run(rewards, ["a", "b", "c"], batch_size=2, max_rounds=3)
    assert requests == [2] and rounds == [0]
    assert [e.group_id for e in result.ok_episodes] == ["a"] * N + ["b"] * N
    assert metrics == {"dynamic/rounds": 1.0, "dynamic/tasks": 2.0, "dynamic/kept_groups": 2.0,
                       "dynamic/dropped_groups": 0.0, "dynamic/surplus_groups": 0.0,
                       "dynamic/episodes_per_kept_group": 4.0}


def test_equal_reward_groups_are_dropped_and_refilled() -> None:
    # Round 0: a, b, c, d -> only a has signal (keep rate 1/4): 3 groups missing -> asks 4 (capped
    # at batch_size, not 12). Round 1: e, f, g, h -> f, h have signal, g too: one is surplus.
    rewards = {"a": SIGNAL, "b": ZEROS, "c": ONES, "d": ZEROS,
               "e": ZEROS, "f": SIGNAL, "g": SIGNAL, "h": SIGNAL}
    result, metrics, requests, rounds = run(rewards, list("abcdefgh"), batch_size=4, max_rounds=3)
    assert requests == [4, 4] and rounds == [0, 1]
    kept = list(dict.fromkeys(e.group_id for e in result.ok_episodes))
    assert kept == ["a", "f", "g", "h"]
    assert sorted(result.dropped_groups) == ["b", "c", "d", "e"]
    assert len(result.episodes) == 8 * N  # every episode rolled out is reported
    assert metrics["dynamic/episodes_per_kept_group"] == 8 * N / 4
    assert metrics["dynamic/surplus_groups"] == 0.0


def test_the_refill_scales_with_the_keep_rate() -> None:
    # Round 0 keeps 2 of 4 (rate 1/2), 2 missing -> 4 tasks; round 1 keeps 3 -> one surplus.
    rewards = {t: (SIGNAL if t in "abefg" else ZEROS) for t in "abcdefgh"}
    result, metrics, requests, _ = run(rewards, list("abcdefgh"), batch_size=4, max_rounds=3)
    assert requests == [4, 4]
    assert metrics["dynamic/kept_groups"] == 4.0 and metrics["dynamic/surplus_groups"] == 1.0
    assert list(dict.fromkeys(e.group_id for e in result.ok_episodes)) == ["a", "b", "e", "f"]


def test_the_cap_stops_sampling() -> None:
    rewards = {t: ZEROS for t in "abcdefgh"}
    rewards["h"] = SIGNAL
    result, metrics, requests, rounds = run(rewards, list("abcdefgh"), batch_size=2, max_rounds=3)
    assert requests == [2, 2, 2] and rounds == [0, 1, 2]  # 6 tasks = batch_size * max_rounds
    assert result.ok_episodes == [] and metrics["dynamic/kept_groups"] == 0.0
    assert "dynamic/episodes_per_kept_group" not in metrics
    assert metrics["dynamic/dropped_groups"] == 6.0


def test_failed_episodes_give_no_signal() -> None:
    # Group a: one ok episode left (nothing to compare with); b: failures plus two different rewards.
    rewards = {"a": ["x", "x", "x", 1], "b": ["x", 1, 0, "x"]}
    result, metrics, _, _ = run(rewards, ["a", "b"], batch_size=2, max_rounds=1)
    assert [e.episode_id for e in result.ok_episodes] == ["b-e1", "b-e2"]
    assert result.dropped_groups == ["a"] and metrics["dynamic/kept_groups"] == 1.0


def test_a_plain_episode_list_is_accepted() -> None:
    async def rollout(tasks: list[WorkflowTask], round_index: int) -> list[Episode]:
        return [Episode(episode_id=f"{t.task_id}-{i}", task=t, group_id=t.task_id, reward=float(i))
                for t in tasks for i in range(2)]

    result, metrics = asyncio.run(sample_with_signal(rollout, Tasks(["a"]), batch_size=1, max_rounds=2))
    assert len(result.ok_episodes) == 2 and metrics["dynamic/rounds"] == 1.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_rounds"):
        asyncio.run(sample_with_signal(scripted_rollout({}, []), Tasks([]), batch_size=2, max_rounds=0))

"""Per-role rewards (issue 26): `WorkflowOutput(reward={role: r})`, GRPO groups per (task, role)
against hand-computed advantages, a role the episode never registered refused with its name and
the fix, per-role metrics, groups with signal, `ajet serve` finish payloads, GPU backbones."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError
from test_episode_api import chat, make_server  # noqa: F401 - make_server is a fixture

from ajet.algorithms.advantages import compute_role_advantages
from ajet.backbones.gpu_worker import refuse_role_rewards
from ajet.config.schema import AlgorithmConfig, ContextConfig, RolloutConfig
from ajet.context.types import LLMCall, Timeline
from ajet.errors import UserError
from ajet.rl.samples import build_step_batch
from ajet.rollout.dynamic import _split_groups
from ajet.rollout.episode import Episode
from ajet.rollout.manager import RolloutResult, drop_equal_reward_groups, zero_std_frac
from ajet.rollout.runner import TaskRunner
from ajet.rollout.scoring import EpisodeRoles, score_episode
from ajet.workflow import Workflow, WorkflowOutput, WorkflowTask, describe_output_error

S3 = math.sqrt(1 / 3)  # the unbiased std of [1, 0, 0]
EPS = 1e-6  # GRPO's (r - mean) / (std + eps)


# ------------------------------------------------------------------ advantages per (task, role)
def test_role_advantages_compare_each_role_with_itself_in_its_group() -> None:
    # A zero-sum game: every episode's mean reward is 0.5, so one reward per episode would
    # teach nothing. Per role: wolf won e0 and lost e1, e2; the villagers the other way round.
    # g2: both wolves got 0.5 (no signal); only e3 rewarded the villager (a group of one).
    ids, groups = ["e0", "e1", "e2", "e3", "e4"], ["g1", "g1", "g1", "g2", "g2"]
    rewards = [{"wolf": 1.0, "villager": 0.0}, {"wolf": 0.0, "villager": 1.0}, {"wolf": 0.0, "villager": 1.0},
               {"wolf": 0.5, "villager": 1.0}, {"wolf": 0.5}]
    got = compute_role_advantages(AlgorithmConfig(name="grpo"), ids, rewards, groups)
    win, lose = (2 / 3) / (S3 + EPS), (-1 / 3) / (S3 + EPS)  # (r - 1/3) / std
    expected = {"e0": {"wolf": win, "villager": -win}, "e1": {"wolf": lose, "villager": -lose},
                "e2": {"wolf": lose, "villager": -lose}, "e3": {"wolf": 0.0, "villager": 0.0}, "e4": {"wolf": 0.0}}
    assert got.keys() == expected.keys()
    for eid, roles in expected.items():
        assert got[eid] == pytest.approx(roles, abs=1e-9), eid
    assert win == pytest.approx(1.1547, abs=1e-4)

    rloo = compute_role_advantages(AlgorithmConfig(name="rloo"), ids, rewards, groups)
    # r_i - mean of the others: wolf e0: 1 - 0; e1: 0 - (1 + 0) / 2
    assert rloo["e0"] == {"wolf": 1.0, "villager": -1.0}
    assert rloo["e1"] == {"wolf": -0.5, "villager": 0.5}
    assert rloo["e4"] == {"wolf": 0.0}


def test_reinforce_pp_whitens_each_role_over_the_batch() -> None:
    ids, groups = ["e0", "e1"], ["g1", "g2"]
    rewards = [{"a": 3.0, "b": 10.0}, {"a": 1.0, "b": 10.0}]
    got = compute_role_advantages(AlgorithmConfig(name="reinforce_pp", gamma=1.0), ids, rewards, groups)
    # role a: returns [3, 1], mean 2, unbiased var 2: (3 - 2) / sqrt(2 + 1e-8); role b: equal, 0
    assert got["e0"]["a"] == pytest.approx(1 / math.sqrt(2), abs=1e-6)
    assert got["e1"]["a"] == pytest.approx(-1 / math.sqrt(2), abs=1e-6)
    assert got["e0"]["b"] == got["e1"]["b"] == 0.0


def game(eid: str, group: str, reward: float | dict[str, float], roles: tuple[str, ...] = ("wolf", "villager")) -> Episode:
    """One call per role, each its own timeline (prompt [1, 2, 3 + k], completion [10 + k, 11 + k])."""
    timelines = []
    for k, role in enumerate(roles):
        ids = [1, 2, 3 + k, 10 + k, 11 + k]
        timelines.append(Timeline(timeline_id=k, role=role, token_ids=ids, trainable=[i >= 3 for i in range(5)],
                                  logprobs=[0.0, 0.0, 0.0, -1.0, -1.0], call_indices=[k], completion_spans=[(3, 5)]))
    episode = Episode(episode_id=eid, task=WorkflowTask(task_id=group), group_id=group, timelines=timelines,
                      role_calls={role: 1 for role in roles}, role_tokens={role: 2 for role in roles})
    if isinstance(reward, dict):
        episode.role_rewards, episode.reward = dict(reward), sum(reward.values()) / len(reward)
    else:
        episode.reward = reward
    return episode


def trained_advantages(batch) -> dict[tuple[str, str], float]:
    out = {}
    for s in batch.samples:
        values = {a for m, a in zip(s.loss_mask, s.advantage, strict=True) if m}
        assert len(values) == 1
        out[(s.episode_id, s.role)] = values.pop()
    return out


def test_build_step_batch_gives_each_roles_samples_their_roles_advantage_and_reward() -> None:
    episodes = [game("e0", "g1", {"wolf": 1.0, "villager": 0.0}), game("e1", "g1", {"wolf": 0.0, "villager": 1.0}),
                game("e2", "g1", {"wolf": 0.0, "villager": 1.0}),
                # g2 mixes a single reward (counted for every role) with a per-role one
                game("e3", "g2", 1.0), game("e4", "g2", {"wolf": 0.0, "villager": 1.0})]
    batch = build_step_batch(episodes, ContextConfig(), AlgorithmConfig(), model_max_len=64)
    win, lose = (2 / 3) / (S3 + EPS), (-1 / 3) / (S3 + EPS)
    half = 0.5 / (math.sqrt(0.5) + EPS)  # wolf in g2: [1.0, 0.0]
    assert trained_advantages(batch) == pytest.approx({
        ("e0", "wolf"): win, ("e0", "villager"): -win, ("e1", "wolf"): lose, ("e1", "villager"): -lose,
        ("e2", "wolf"): lose, ("e2", "villager"): -lose,
        ("e3", "wolf"): half, ("e3", "villager"): 0.0, ("e4", "wolf"): -half, ("e4", "villager"): 0.0}, abs=1e-9)
    rewards = {(s.episode_id, s.role): s.reward for s in batch.samples}
    assert rewards[("e0", "wolf")] == 1.0 and rewards[("e0", "villager")] == 0.0 and rewards[("e3", "wolf")] == 1.0


def test_without_role_rewards_nothing_changes() -> None:
    episodes = [game("e0", "g1", 1.0), game("e1", "g1", 0.0), game("e2", "g1", 0.0)]
    batch = build_step_batch(episodes, ContextConfig(), AlgorithmConfig(), model_max_len=64)
    win, lose = (2 / 3) / (S3 + EPS), (-1 / 3) / (S3 + EPS)  # one group of the task: both roles alike
    assert trained_advantages(batch) == pytest.approx({
        ("e0", "wolf"): win, ("e0", "villager"): win, ("e1", "wolf"): lose, ("e1", "villager"): lose,
        ("e2", "wolf"): lose, ("e2", "villager"): lose}, abs=1e-9)


# ------------------------------------------------------------------ scoring: validation
BOTH = EpisodeRoles(known=frozenset({"wolf", "villager"}), trained=frozenset({"wolf", "villager"}))


def scored(output: Any, roles: EpisodeRoles | None = BOTH, judge: Any = None) -> Episode:
    episode = Episode(episode_id="e0", task=WorkflowTask(task_id="t0"), group_id="t0")
    asyncio.run(score_episode(episode, output, judge, 5.0, workflow="game", roles=roles))
    return episode


def test_a_per_role_reward_sets_role_rewards_their_mean_and_success() -> None:
    episode = scored(WorkflowOutput(reward={"wolf": 1, "villager": 0.0}))
    assert episode.ok and episode.role_rewards == {"wolf": 1.0, "villager": 0.0}
    assert episode.reward == 0.5 and episode.is_success is False  # every role must reach 1
    assert scored(WorkflowOutput(reward={"wolf": 1.0, "villager": 1.0})).is_success is True
    assert scored(WorkflowOutput(reward={"wolf": 0.0, "villager": 0.5}, is_success=True)).is_success is True
    assert scored(WorkflowOutput(reward=0.5)).role_rewards == {}


def test_a_role_the_episode_never_registered_fails_it_naming_the_role_and_the_fix() -> None:
    episode = scored(WorkflowOutput(reward={"wolf": 1.0, "villager": 0.0, "wolff": 1.0}))
    assert episode.status == "failed" and episode.reason == "bad_output"
    assert "['wolff']" in episode.error_message and "never registered" in episode.error_message
    assert "tuner.register_model(role)" in episode.error_message and "workflow 'game'" in episode.error_message
    missing = scored(WorkflowOutput(reward={"wolf": 1.0}))
    assert missing.reason == "bad_output" and "no entry for role(s) ['villager']" in missing.error_message
    steps = scored(WorkflowOutput(reward={"wolf": 1.0, "villager": 0.0}, step_rewards=[0.0, 1.0]))
    assert steps.reason == "bad_output" and "step_rewards" in steps.error_message


def test_a_reward_dict_of_the_wrong_types_names_the_role() -> None:
    for bad, shown in [({"wolf": "1"}, "reward.wolf='1' (str)"), ({"wolf": float("nan")}, "reward.wolf=nan"),
                       ({"wolf": True}, "reward.wolf=True (bool)"), ({}, "reward={} (dict)"),
                       ("0.7", "reward='0.7' (str)")]:
        with pytest.raises(ValidationError) as info:
            WorkflowOutput(reward=bad)
        assert shown in describe_output_error(info.value), bad


class RoleJudge:
    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict

    def compute_reward(self, task: WorkflowTask, output: WorkflowOutput) -> Any:
        return self.verdict


def test_a_judge_may_give_per_role_rewards_checked_like_the_workflows() -> None:
    episode = scored(WorkflowOutput(), judge=RoleJudge(({"wolf": 0.0, "villager": 1.0}, True)))
    assert episode.ok and episode.role_rewards == {"wolf": 0.0, "villager": 1.0} and episode.is_success
    assert episode.output.reward == {"wolf": 0.0, "villager": 1.0}
    assert scored(WorkflowOutput(), judge=RoleJudge({"wolf": "1"})).reason == "judge_error:bad_return"
    assert scored(WorkflowOutput(), judge=RoleJudge({"seer": 1.0, "wolf": 0.0, "villager": 0.0})).reason == "bad_output"


# ------------------------------------------------------------------ the runner checks what the tuner knows
@dataclass
class Tracker:
    calls: list[LLMCall] = field(default_factory=list)

    def timelines(self) -> list[Any]:
        return []

    def stats(self) -> dict[str, int]:
        return {}


@dataclass
class Session:
    """What a ModelTuner reads of its session, and the episode's tracker."""

    tracker: Tracker = field(default_factory=Tracker)
    trainable_targets: set[str] | None = None

    def is_trainable(self, role: str) -> bool:
        return True


@dataclass
class Handle:
    tuner: Any
    tracker: Tracker

    def close(self) -> None:
        pass


class Factory:
    def open_episode(self, episode_id: str, task: WorkflowTask) -> Handle:
        from ajet.tuner import ModelTuner  # agentscope

        session = Session()
        return Handle(ModelTuner(session, role="wolf"), session.tracker)


class Game(Workflow):
    """The wolf calls the model (recorded as the session would); the seer is registered but
    never calls; the reward names `task.metadata["roles"]`."""

    async def execute(self, task: WorkflowTask, tuner: Any) -> WorkflowOutput:
        tuner.register_model("seer")
        tuner.session.tracker.calls.append(LLMCall(
            role="wolf", prompt_ids=[1], completion_ids=[2, 3], completion_logprobs=[-1.0, -1.0],
            finish_reason="stop", policy_version=0))
        return WorkflowOutput(reward={role: 1.0 for role in task.metadata["roles"]})


def run_game(roles: list[str]) -> Episode:
    runner = TaskRunner(Game(), None, Factory(), RolloutConfig(episode_timeout_s=10))
    return asyncio.run(runner.run_episode(WorkflowTask(task_id="t", metadata={"roles": roles}), "t-e0", "t"))


def test_the_runner_accepts_roles_that_called_or_registered_and_refuses_others() -> None:
    pytest.importorskip("agentscope")
    ok = run_game(["wolf", "seer"])
    assert ok.ok and ok.role_rewards == {"wolf": 1.0, "seer": 1.0}
    assert ok.role_calls == {"wolf": 1} and ok.role_tokens == {"wolf": 2}
    typo = run_game(["wolf", "sear"])
    assert typo.reason == "bad_output" and "['sear']" in typo.error_message
    assert "['seer', 'wolf']" in typo.error_message  # what the episode knows
    unrewarded = run_game(["seer"])  # the wolf's calls are trained
    assert unrewarded.reason == "bad_output" and "['wolf']" in unrewarded.error_message


# ------------------------------------------------------------------ metrics and groups with signal
def test_role_metrics_in_the_step_metrics() -> None:
    episodes = [game("e0", "g1", {"wolf": 1.0, "villager": 0.0}), game("e1", "g1", {"wolf": 0.0, "villager": 1.0}),
                game("e2", "g1", {"wolf": 1.0, "villager": 0.5}, roles=("wolf",)), game("e3", "g2", 1.0)]
    episodes[3].is_success = True
    episodes[0].role_tokens = {"wolf": 7, "villager": 3}
    metrics = RolloutResult(episodes=episodes, ok_episodes=episodes).metrics()
    roles = {k: v for k, v in metrics.items() if k.startswith("role/")}
    # wolf rewards 1, 0, 1 and e3's single 1.0; villager 0, 1, 0.5 and 1.0
    assert roles == pytest.approx({
        "role/wolf/reward": 0.75, "role/wolf/success": 0.75, "role/wolf/calls": 1.0, "role/wolf/tokens": 13 / 4,
        "role/villager/reward": 2.5 / 4, "role/villager/success": 0.5, "role/villager/calls": 0.75,
        "role/villager/tokens": 7 / 4})
    assert metrics["reward/mean"] == pytest.approx((0.5 + 0.5 + 0.75 + 1.0) / 4)
    single = [game("e0", "g", 1.0, roles=("default",)), game("e1", "g", 0.0, roles=("default",))]
    assert not any(k.startswith("role/") for k in RolloutResult(episodes=single, ok_episodes=single).metrics())


def test_a_group_has_signal_when_any_roles_rewards_differ() -> None:
    zero_sum = [game("a0", "a", {"wolf": 1.0, "villager": 0.0}), game("a1", "a", {"wolf": 0.0, "villager": 1.0})]
    draws = [game("b0", "b", {"wolf": 0.5, "villager": 0.5}), game("b1", "b", {"wolf": 0.5, "villager": 0.5})]
    one_role = [game("c0", "c", {"wolf": 1.0, "villager": 0.0}), game("c1", "c", {"wolf": 1.0, "villager": 1.0})]
    episodes = zero_sum + draws + one_role
    assert all(e.reward == 0.5 for e in zero_sum)  # one reward per episode: no signal
    kept, dropped = drop_equal_reward_groups(episodes)
    assert dropped == ["b"] and [e.group_id for e in kept] == ["a", "a", "c", "c"]
    assert zero_std_frac(episodes) == pytest.approx(1 / 3)
    with_signal, without = _split_groups(episodes)  # dynamic sampling keeps the same groups
    assert sorted(with_signal) == ["a", "c"] and without == ["b"]


# ------------------------------------------------------------------ GPU backbones refuse, never average
def test_gpu_backbones_refuse_per_role_rewards_naming_the_roles_and_the_setting() -> None:
    refuse_role_rewards(game("e0", "g", 1.0))
    with pytest.raises(UserError, match=r"per-role rewards \{'wolf': 1.0, 'villager': 0.0\}.*--backbone=debug"):
        refuse_role_rewards(game("e0", "g", {"wolf": 1.0, "villager": 0.0}))


# ------------------------------------------------------------------ `ajet serve`: finish with {role: reward}
def test_serve_finish_takes_per_role_rewards_and_says_why_one_is_refused(make_server: Any) -> None:  # noqa: F811
    pytest.importorskip("agentscope")
    server = make_server(n=2, batch_size=1)
    first, second = server.client.begin(), server.client.begin()
    assert chat(first).status_code == 200 and chat(second).status_code == 200
    done = server.client.finish(first.episode_id, {"default": 0.75})
    assert done["status"] == "ok" and done["reward"] == 0.75 and done["role_rewards"] == {"default": 0.75}
    refused = server.client.finish(second.episode_id, {"default": 1.0, "wolf": 0.0})
    assert refused["status"] == "failed" and refused["reason"] == "bad_output" and refused["reward"] is None
    assert "['wolf']" in refused["detail"] and "register" in refused["detail"]
    result = asyncio.run(server.broker.next_batch(1))
    assert [e.role_rewards for e in result.ok_episodes] == [{"default": 0.75}]

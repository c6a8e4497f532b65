"""GiGPO's step credit (`gigpo_advantages`) against values computed by hand: the episode's GRPO
advantage plus `weight` times the step's normalised discounted return inside its state group."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ajet.algorithms.advantages import assign_token_advantages
from ajet.algorithms.gigpo import gigpo_advantages
from ajet.context.types import Sample

REPO = Path(__file__).resolve().parents[2]

R2 = 1 / math.sqrt(2)  # the GRPO advantage of rewards (1, 0): +-0.5 / std, std = sqrt(0.5)


def test_two_rollouts_that_pass_the_same_state() -> None:
    # A: s0 -> sA, reward 1; B: s0 -> sB, reward 0; gamma 0.5, so A's returns are (0.5, 1), B's (0, 0).
    values, stats = gigpo_advantages([1.0, 0.0], ["g", "g"], [["s0", "sA"], ["s0", "sB"]], gamma=0.5)
    # s0's group: returns (0.5, 0), mean 0.25, std sqrt(0.125) -> +-0.25 / 0.35355 = +-R2.
    assert values[0] == pytest.approx([R2 + R2, R2], rel=1e-5)
    assert values[1] == pytest.approx([-R2 - R2, -R2], rel=1e-5)  # sA, sB: groups of one, the episode's
    assert (stats.steps, stats.marked, stats.grouped, stats.groups) == (4, 4, 2, 3)
    assert stats.grouped_share == 0.5 and stats.mean_group_size == pytest.approx(4 / 3)


def test_a_state_visited_twice_in_one_episode() -> None:
    # A: s0, s0, s1 with reward 1; B: s0, s2 with reward 0; gamma 1: A's returns (1, 1, 1), B's (0, 0).
    values, stats = gigpo_advantages([1.0, 0.0], ["g", "g"], [["s0", "s0", "s1"], ["s0", "s2"]], gamma=1.0,
                                     weight=0.5)
    # s0's group holds A's two steps and B's first: returns (1, 1, 0), mean 2/3, std sqrt(1/3).
    step_a, step_b = (1 / 3) / math.sqrt(1 / 3), (-2 / 3) / math.sqrt(1 / 3)
    assert values[0] == pytest.approx([R2 + 0.5 * step_a, R2 + 0.5 * step_a, R2], rel=1e-5)
    assert values[1] == pytest.approx([-R2 + 0.5 * step_b, -R2], rel=1e-5)
    assert (stats.grouped, stats.groups) == (3, 3)


def test_lone_and_unmarked_steps_and_other_tasks_keep_the_episode_advantage() -> None:
    values, stats = gigpo_advantages(
        [1.0, 0.0, 1.0, 0.0], ["g1", "g1", "g2", "g2"],
        [["x", None], ["y", None], ["x"], ["z"]],  # "x" in two tasks: different groups
        gamma=0.9)
    expected = [[R2, R2], [-R2, -R2], [R2], [-R2]]
    assert [len(v) for v in values] == [2, 2, 1, 1]
    assert sum(values, []) == pytest.approx(sum(expected, []), rel=1e-5)
    assert (stats.steps, stats.marked, stats.grouped) == (6, 4, 0)  # step credit did nothing here


def test_step_rewards_enter_the_returns() -> None:
    # Both start at s0; A then gets a step reward of 1 at its second call and a final reward of 0.
    values, _ = gigpo_advantages([0.0, 0.0], ["g", "g"], [["s0", "s1"], ["s0", "s2"]],
                                 step_rewards=[[0.0, 1.0], [0.0, 0.0]], gamma=0.5, norm_by_std=False)
    # The episodes tie (advantage 0); s0's returns are (0.5, 0): mean 0.25, unnormalised +-0.25.
    assert values[0] == pytest.approx([0.25, 0.0]) and values[1] == pytest.approx([-0.25, 0.0])


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match="step_states"):
        gigpo_advantages([1.0, 0.0], ["g", "g"], [["s"]])
    with pytest.raises(ValueError, match="2 step rewards for 1 calls"):
        gigpo_advantages([1.0, 0.0], ["g", "g"], [["s"], ["s"]], step_rewards=[[0.0, 1.0], None])


def test_in_a_merged_sample_each_call_gets_its_own_step_value() -> None:
    values, _ = gigpo_advantages([1.0, 0.0], ["g", "g"], [["s0", "sA"], ["s0", "sB"]], gamma=0.5)
    # Episode A's two calls merged into one sample: prompt, call 0's reply, a tool result, call 1's reply.
    merged = Sample(input_ids=list(range(8)), loss_mask=[0, 0, 1, 1, 0, 0, 1, 1], old_logprobs=[0.0] * 8,
                    episode_id="A", token_call_ids=[-1, -1, 0, 0, -1, -1, 1, 1], num_calls=2)
    assign_token_advantages([merged], {"A": values[0], "B": values[1]})
    assert merged.advantage == pytest.approx([0, 0, 2 * R2, 2 * R2, 0, 0, R2, R2], rel=1e-5)


def episode(episode_id: str, reward: float, states: list[str | None] | None, calls: int) -> Any:
    from ajet import WorkflowOutput

    return SimpleNamespace(episode_id=episode_id, group_id="g", reward=reward, role_rewards={}, role_calls={},
                           num_calls=calls, output=WorkflowOutput(reward=reward, step_states=states))


def test_the_recipe_uses_the_workflows_states_and_counts_the_groups() -> None:
    from ajet.config.schema import AlgorithmConfig, StepCredit
    from ajet.rl.samples import episode_advantages

    algorithm = AlgorithmConfig(step_credit=StepCredit.gigpo, step_credit_gamma=0.5)
    # B marked one state for its two calls: its second call is unmarked (the episode advantage).
    episodes = [episode("A", 1.0, ["s0", "sA"], 2), episode("B", 0.0, ["s0"], 2)]
    metrics: dict[str, float] = {}
    values = episode_advantages(episodes, algorithm, metrics=metrics)
    assert values["A"] == pytest.approx([2 * R2, R2], rel=1e-5)
    assert values["B"] == pytest.approx([-2 * R2, -R2], rel=1e-5)
    assert metrics == pytest.approx({"credit/state_grouped_share": 0.5, "credit/state_group_size": 1.5,
                                     "credit/state_marked_share": 0.75})
    # without step credit: GRPO's one value per episode
    assert episode_advantages(episodes, AlgorithmConfig()) == pytest.approx({"A": R2, "B": -R2}, rel=1e-5)


def test_step_credit_needs_grpo_and_is_told_when_states_never_repeat() -> None:
    from ajet.config.loader import load_config
    from ajet.errors import ConfigError
    from ajet.outputs.learning_signs import find_learning_signs

    with pytest.raises(ConfigError, match="algorithm.step_credit"):
        load_config(None, overrides=["algorithm.name=reinforce_pp", "algorithm.step_credit=gigpo"],
                    require_workflow=False)
    rows = [{"split": "train", "step": s, "credit/state_grouped_share": 0.0, "credit/state_marked_share": 1.0}
            for s in (1, 2, 3)]
    signs = find_learning_signs(rows)
    assert [sign.name for sign in signs] == ["step_credit_idle"]
    assert "no marked state repeated" in signs[0].evidence
    rows[1]["credit/state_grouped_share"] = 0.25
    assert find_learning_signs(rows) == []


def test_a_warm_up_stage_before_grpo_with_step_credit_is_valid() -> None:
    """frozenlake_step_credit.yaml's pipeline (sft, then grpo with step credit): the SFT stage has
    no advantage to add to, so it runs without step credit instead of refusing the config (it
    did: 'step_credit ... needs algorithm.name=grpo (not sft)')."""
    from ajet.config.loader import load_config
    from ajet.config.validate import single_stage_config

    cfg = load_config(REPO / "tutorial/example_frozenlake/frozenlake_step_credit.yaml",
                      overrides=["pipeline.stages=[eval,sft,grpo,eval]"])
    assert single_stage_config(cfg, "sft").algorithm.step_credit.value == "none"
    assert single_stage_config(cfg, "grpo").algorithm.step_credit.value == "gigpo"

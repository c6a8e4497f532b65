"""Advantages against independent numpy / loop references written here."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest

from ajet.algorithms.advantages import assign_token_advantages, compute_advantages
from ajet.algorithms.grpo import grpo_advantages
from ajet.algorithms.reinforce_pp import reinforce_pp_advantages
from ajet.algorithms.rloo import rloo_advantages
from ajet.config.schema import AlgorithmConfig
from ajet.context.types import Sample


def _random_batch(seed: int, n_groups: int = 4, max_size: int = 5):
    rng = random.Random(seed)
    rewards, groups = [], []
    for g in range(n_groups):
        for _ in range(rng.randint(1, max_size)):
            rewards.append(rng.choice([0.0, 1.0, rng.uniform(-2, 3)]))
            groups.append(f"task{g}")
    order = list(range(len(rewards)))
    rng.shuffle(order)  # groups interleaved, as a rollout batch can be
    return [rewards[i] for i in order], [groups[i] for i in order]


def _numpy_grpo(rewards, groups, norm_by_std, eps=1e-6):
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(groups)
    out = np.zeros_like(r)
    for gid in set(groups):
        m = g == gid
        if m.sum() < 2:
            continue
        centered = r[m] - r[m].mean()
        out[m] = centered / (r[m].std(ddof=1) + eps) if norm_by_std else centered
    return out


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_matches_numpy(norm_by_std, seed):
    rewards, groups = _random_batch(seed)
    got = grpo_advantages(rewards, groups, norm_by_std=norm_by_std)
    np.testing.assert_allclose(
        got, _numpy_grpo(rewards, groups, norm_by_std), rtol=1e-9, atol=1e-12
    )


def test_grpo_hand_values_and_edge_cases():
    # group a: [1, 0, 0, 1] mean .5, unbiased std sqrt(1/3)
    got = grpo_advantages([1, 0, 0, 1, 7.0], ["a", "a", "a", "a", "solo"], eps=0.0)
    s = (1 / 3) ** 0.5
    assert got == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0])
    # all-equal group: zero advantage, no division blow-up
    assert grpo_advantages([1.0, 1.0, 1.0], ["g"] * 3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="one entry"):
        grpo_advantages([1.0], ["a", "b"])


@pytest.mark.parametrize("seed", [0, 3])
def test_rloo_matches_loop(seed):
    rewards, groups = _random_batch(seed)
    expected = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == g and j != i]
        expected.append(r - sum(others) / len(others) if others else 0.0)
    assert rloo_advantages(rewards, groups) == pytest.approx(expected, abs=1e-12)
    # RLOO = n/(n-1) * (r - mean) within a group
    assert rloo_advantages([1.0, 0.0, 0.0], ["g"] * 3) == pytest.approx([1.0, -0.5, -0.5])


def _numpy_reinforce_pp(rewards, step_rewards, gamma, eps=1e-8):
    returns = []
    for i, final in enumerate(rewards):
        steps = np.array(step_rewards[i] if step_rewards and step_rewards[i] else [0.0], float)
        steps[-1] += final
        t = len(steps)
        # G = D @ r with D[s, k] = gamma^(k-s) for k >= s
        k = np.arange(t)
        d = np.where(k[None, :] >= k[:, None], gamma ** (k[None, :] - k[:, None]), 0.0)
        returns.append(d @ steps)
    flat = np.concatenate(returns)
    mean, var = flat.mean(), flat.var(ddof=1)
    return [(g - mean) / np.sqrt(var + eps) for g in returns]


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_with_step_rewards_matches_numpy(gamma):
    rng = random.Random(7)
    rewards = [rng.uniform(-1, 1) for _ in range(5)]
    steps = [[rng.uniform(-0.5, 0.5) for _ in range(rng.randint(1, 4))] for _ in range(5)]
    steps[2] = None  # an episode without step rewards is one step
    got = reinforce_pp_advantages(rewards, step_rewards=steps, gamma=gamma)
    want = _numpy_reinforce_pp(rewards, steps, gamma)
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)
    flat = np.concatenate(got)
    assert abs(flat.mean()) < 1e-9 and flat.std(ddof=1) == pytest.approx(1.0, rel=1e-6)


def test_reinforce_pp_without_step_rewards_hand_values():
    # one step per episode: whitened final rewards; mean 1, unbiased var 1 -> r - 1
    got = reinforce_pp_advantages([0.0, 1.0, 2.0], gamma=0.5)
    assert got == [[pytest.approx(-1.0)], [pytest.approx(0.0)], [pytest.approx(1.0)]]
    # gamma: steps [1, 0] + final 2 on the last -> returns [1 + .5 * 2, 2] = [2, 2]
    assert reinforce_pp_advantages([2.0, 0.0], step_rewards=[[1.0, 0.0], [0.0]], gamma=0.5)[0] == [
        pytest.approx(g) for g in _numpy_reinforce_pp([2.0, 0.0], [[1.0, 0.0], [0.0]], 0.5)[0]
    ]
    assert reinforce_pp_advantages([5.0]) == [[0.0]]


def _sample(episode_id: str, mask: list[int]) -> Sample:
    return Sample(
        input_ids=list(range(len(mask))),
        loss_mask=mask,
        old_logprobs=[0.0] * len(mask),
        episode_id=episode_id,
    )


def test_assign_episode_level():
    a, b = _sample("e1", [0, 0, 1, 1, 0, 1]), _sample("e2", [1, 0])
    assign_token_advantages([a, b], {"e1": 0.5, "e2": -2.0})
    assert a.advantage == [0.0, 0.0, 0.5, 0.5, 0.0, 0.5]
    assert b.advantage == [-2.0, 0.0]
    with pytest.raises(KeyError, match="e3"):
        assign_token_advantages([_sample("e3", [1])], {"e1": 1.0})


def test_assign_per_step_uses_token_call_ids():
    s = _sample("e1", [0, 1, 1, 0, 1, 1])
    s.token_call_ids = [-1, 0, 0, -1, 2, 2]  # call 1 is an untrained role
    assign_token_advantages([s], {"e1": [0.3, 9.0, -0.7]})
    assert s.advantage == [0.0, 0.3, 0.3, 0.0, -0.7, -0.7]
    bad = _sample("e1", [1])
    bad.token_call_ids = [3]
    with pytest.raises(ValueError, match="call 3"):
        assign_token_advantages([bad], {"e1": [0.3, 9.0, -0.7]})


def test_assign_per_step_without_call_ids_falls_back_to_episode_value(caplog):
    s = _sample("e1", [1, 0, 1])
    if hasattr(s, "token_call_ids"):
        s.token_call_ids = []  # the field exists but this sample has none
    with caplog.at_level(logging.WARNING):
        assign_token_advantages([s], {"e1": [0.25, -1.0]})
    assert s.advantage == [0.25, 0.0, 0.25]
    assert "token_call_ids" in caplog.text


def test_compute_advantages_dispatch():
    ids, rewards, groups = ["x", "y", "z"], [1.0, 0.0, 0.5], ["g", "g", "h"]
    got = compute_advantages(
        AlgorithmConfig(name="grpo", norm_adv_by_std=False), ids, rewards, groups
    )
    assert got == {"x": 0.5, "y": -0.5, "z": 0.0}
    got = compute_advantages(AlgorithmConfig(name="rloo"), ids, rewards, groups)
    assert got == {"x": 1.0, "y": -1.0, "z": 0.0}
    got = compute_advantages(AlgorithmConfig(name="reinforce_pp", gamma=0.9), ids, rewards, groups)
    assert set(got) == set(ids) and all(len(v) == 1 for v in got.values())
    with pytest.raises(ValueError, match="no advantages"):
        compute_advantages(AlgorithmConfig(name="sft"), ids, rewards, groups)

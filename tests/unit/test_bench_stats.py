"""scripts/bench/stats.py: the paired bootstrap over test tasks against cases with a known
answer (the normal approximation on large samples, an exact small case, degenerate rows), the
verdict rule, and the episodes that resolve a gain."""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

Z = NormalDist().inv_cdf(0.975)


@pytest.fixture
def stats(script: Any) -> Any:
    return script("bench.stats")


def one_each(values: Any) -> dict[str, list[float]]:
    return {f"t{i}": [float(v)] for i, v in enumerate(values)}


def test_a_large_sample_matches_the_normal_approximation(stats: Any) -> None:
    """With thousands of tasks the bootstrap interval of a mean is mean +- 1.96 sd / sqrt(n)."""
    rng = np.random.default_rng(1)
    values = rng.normal(0.5, 0.2, 3000)
    iv = stats.paired_bootstrap(None, one_each(values))["trained"]
    half = Z * values.std() / np.sqrt(values.size)
    assert iv.low == pytest.approx(values.mean() - half, abs=0.03 * half)
    assert iv.high == pytest.approx(values.mean() + half, abs=0.03 * half)


def test_the_gain_is_the_paired_difference_not_two_independent_spreads(stats: Any) -> None:
    """Tasks vary a lot (base sd 0.3) and training adds 0.1 +- 0.05 to each: the gain's interval is
    the per-task difference's (half-width 1.96 * 0.05 / sqrt(n)), far narrower than base's."""
    rng = np.random.default_rng(2)
    base = rng.normal(0.4, 0.3, 2000)
    diff = 0.1 + rng.normal(0, 0.05, 2000)
    out = stats.paired_bootstrap(one_each(base), one_each(base + diff))
    half = Z * diff.std() / np.sqrt(diff.size)
    assert out["gain"].low == pytest.approx(diff.mean() - half, abs=0.03 * half)
    assert out["gain"].high == pytest.approx(diff.mean() + half, abs=0.03 * half)
    base_half = (out["base"].high - out["base"].low) / 2
    assert base_half > 5 * half


def test_an_exact_small_case(stats: Any) -> None:
    """Two tasks scoring 0 and 1: a resample's mean is 0, 1/2 or 1 (1/4, 1/2, 1/4); the 2.5 % and
    97.5 % points lie in the outer steps, so the interval is [0, 1]."""
    iv = stats.paired_bootstrap(None, one_each([0, 1]))["trained"]
    assert (iv.low, iv.high) == (0.0, 1.0)
    # the mid-distribution quantile: each value at the middle of its step, linear between
    samples = np.array([0.0] * 25 + [1.0] * 50 + [2.0] * 25)
    assert list(stats.mid_quantiles(samples, [0.125, 0.3125, 0.5, 0.875])) == [0.0, 0.5, 1.0, 2.0]


def test_tasks_are_resampled_and_a_tasks_episodes_averaged_first(stats: Any) -> None:
    """Half the tasks have 8 episodes all solved, half one episode failed: the mean over tasks is
    0.5 (the mean over episodes would be 8/9), and its interval is centred there."""
    trained = {f"t{i}": [1.0] * 8 if i % 2 else [0.0] for i in range(400)}
    iv = stats.paired_bootstrap(None, trained)["trained"]
    assert (iv.low + iv.high) / 2 == pytest.approx(0.5, abs=0.01)
    assert iv.high - iv.low == pytest.approx(2 * Z * 0.5 / np.sqrt(400), rel=0.05)


def test_degenerate_rows(stats: Any) -> None:
    # every task the same: no spread, the interval is the value
    out = stats.paired_bootstrap(one_each([0.25] * 32), one_each([0.75] * 32))
    assert [(out[k].low, out[k].high) for k in ("base", "trained", "gain")] == [(0.25, 0.25), (0.75, 0.75), (0.5, 0.5)]
    # one task says nothing of how tasks vary: no interval
    assert stats.paired_bootstrap({"t": [0.0, 1.0]}, {"t": [1.0, 1.0]}) is None
    # base and trained on different tasks cannot be paired
    with pytest.raises(ValueError, match="different tasks"):
        stats.paired_bootstrap(one_each([0, 1, 1]), {"x": [1.0], "y": [0.0], "t2": [1.0]})
    with pytest.raises(ValueError, match="no episode scores for task"):
        stats.paired_bootstrap(None, {"a": [1.0], "b": []})


def test_a_cached_base_is_taken_as_exact(stats: Any) -> None:
    trained = one_each([0, 1, 1, 0, 1, 1, 1, 0])
    out = stats.paired_bootstrap(None, trained, base_value=0.25)
    assert "base" not in out
    assert (out["gain"].low, out["gain"].high) == pytest.approx((out["trained"].low - 0.25, out["trained"].high - 0.25))
    assert "gain" not in stats.paired_bootstrap(None, trained)


def test_a_fixed_seed_repeats_and_other_seeds_agree_to_the_printed_precision(stats: Any) -> None:
    """32 tasks x 4 episodes of 0/1 scores, as a recorded row: the same seed gives the same
    interval; ten other seeds move no endpoint by more than 0.01 (the tables print two decimals)."""
    rng = np.random.default_rng(3)
    skill = rng.uniform(0, 0.6, 32)
    base = {f"t{i}": [float(x) for x in rng.random(4) < p] for i, p in enumerate(skill)}
    trained = {f"t{i}": [float(x) for x in rng.random(4) < p + 0.2] for i, p in enumerate(skill)}
    first = stats.paired_bootstrap(base, trained)
    assert stats.paired_bootstrap(base, trained) == first
    for seed in range(1, 11):
        other = stats.paired_bootstrap(base, trained, seed=seed)
        for key in first:
            assert abs(other[key].low - first[key].low) < 0.01 and abs(other[key].high - first[key].high) < 0.01


def test_the_verdict_compares_the_whole_interval_with_the_threshold(stats: Any) -> None:
    iv = stats.Interval
    assert stats.verdict(iv(0.12, 0.30), 0.10) == "pass"
    assert stats.verdict(iv(0.10, 0.30), 0.10) == "pass"  # thresholds read ">="
    assert stats.verdict(iv(0.0, 0.0), 0.0) == "pass"  # ">= base" and no change at all
    assert stats.verdict(iv(-0.10, 0.05), 0.10) == "FAIL"
    assert stats.verdict(iv(0.05, 0.20), 0.10) == "inconclusive"
    assert stats.verdict(iv(-0.05, 0.09), 0.0) == "inconclusive"


def test_episodes_to_resolve_a_gain(stats: Any) -> None:
    # z^2 * variance / gain^2: 3.8415 * 0.5 / 0.01 = 192.07 -> 193
    assert stats.episodes_to_resolve(0.5) == 193
    assert stats.episodes_to_resolve(0.5, gain=0.2) == 49
    assert stats.episodes_to_resolve(0.0) == 1
    # a row that size has a gain interval +-0.10 wide: the bootstrap agrees with the formula
    variance = 0.42
    n = stats.episodes_to_resolve(variance)
    diffs = np.random.default_rng(4).choice([-1.0, 0.0, 1.0], size=n, p=[0.21, 0.58, 0.21])
    diffs = diffs - diffs.mean() + 0.1
    out = stats.paired_bootstrap(one_each(np.zeros(n)), one_each(diffs))["gain"]
    assert (out.high - out.low) / 2 == pytest.approx(Z * diffs.std() / np.sqrt(n), rel=0.05)
    assert (out.high - out.low) / 2 == pytest.approx(0.10, abs=0.01)


def test_paired_variance_of_a_recorded_row(stats: Any) -> None:
    base = {"a": [0.0, 0.0], "b": [1.0, 0.0], "c": [0.0, 0.0]}
    trained = {"a": [1.0, 1.0], "b": [1.0, 1.0], "c": [0.0, 0.0]}
    variance, tasks, episodes = stats.paired_variance(base, trained)
    assert (tasks, episodes) == (3, 2.0)
    assert variance == pytest.approx(np.var([1.0, 0.5, 0.0], ddof=1))
    with pytest.raises(ValueError, match="two tasks"):
        stats.paired_variance({"a": [0.0]}, {"a": [1.0]})

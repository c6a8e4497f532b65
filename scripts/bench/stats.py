"""The uncertainty of a learning claim: a paired bootstrap over test tasks, the verdict a row's
interval gives against its threshold, and how many episodes resolve a gain. Pure functions over
plain data (task id -> that task's episodes' scores); numpy only.

Why tasks, not episodes: a test split is a sample of tasks, and the episodes of one task are
not independent (a hard map stays hard), so the unit resampled is the task; a task's episodes
are averaged first. Why paired: base and trained play the same tasks, so one resample of task
ids serves both, and the gain's interval is the interval of the per-task difference, narrower
than two independent intervals would give when tasks that are hard for one are hard for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
# 50,000 resamples and mid-distribution quantiles: an endpoint moves by about 0.001 (one standard
# deviation) from one bootstrap seed to another, under the printed 0.01; with 10,000 it moved by
# 0.002, and with plain percentiles of these lattice-valued means by up to a whole lattice step
# (1/16 for 16 tasks): docs/log/2026-12-06_learning_intervals.md.
RESAMPLES = 50_000
SEED = 0  # fixed: the same scores give the same interval on every machine and every rerun
CHUNK = 2_000_000  # task indices drawn at once (16 MB), CHUNK // tasks resamples

Scores = Mapping[str, Sequence[float]]  # task id -> the scores of the task's episodes


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [round(self.low, 6), round(self.high, 6)]


def task_means(scores: Scores) -> dict[str, float]:
    """Each task's mean over its episodes; a ValueError names a task without one."""
    empty = [task for task, values in scores.items() if not values]
    if empty:
        raise ValueError(f"no episode scores for task(s) {', '.join(empty)}")
    return {task: float(np.mean(values)) for task, values in scores.items()}


def paired_bootstrap(base: Scores | None, trained: Scores, *, base_value: float | None = None,
                     resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL) -> dict[str, Interval] | None:
    """The `level` percentile intervals of the base's, the trained model's and the gain's mean
    over tasks: {"base", "trained", "gain"}. Each resample draws the tasks with replacement,
    once for all three (the pairing). Without `base` scores (a cached base), the gain's
    interval is the trained one less `base_value`, taken as exact, and there is no "base".
    None with fewer than two tasks: one task says nothing of how tasks vary. A ValueError when
    base and trained scored different tasks (they cannot be paired)."""
    trained_means = task_means(trained)
    tasks = list(trained_means)
    if base is not None and set(base) != set(tasks):
        raise ValueError(f"base and trained scored different tasks ({len(base)} and {len(tasks)}, "
                         f"{len(set(base) ^ set(tasks))} in one only): the gain needs the same tasks")
    if len(tasks) < 2:
        return None
    columns = [np.array([trained_means[t] for t in tasks])]
    if base is not None:
        base_means = task_means(base)
        columns.append(np.array([base_means[t] for t in tasks]))
    if base is not None:
        columns.append(columns[0] - columns[1])
    rng = np.random.default_rng(seed)
    means: list[list[np.ndarray]] = [[] for _ in columns]
    rows = max(1, CHUNK // len(tasks))
    for start in range(0, resamples, rows):
        draws = rng.integers(0, len(tasks), size=(min(rows, resamples - start), len(tasks)))
        for out_means, values in zip(means, columns, strict=True):
            out_means.append(values[draws].mean(axis=1))
    tails = [(1 - level) / 2, (1 + level) / 2]
    intervals = [Interval(*(float(q) for q in mid_quantiles(np.concatenate(m), tails))) for m in means]
    out = {"trained": intervals[0]}
    if base is not None:
        out["base"], out["gain"] = intervals[1], intervals[2]
    elif base_value is not None:
        out["gain"] = Interval(out["trained"].low - base_value, out["trained"].high - base_value)
    return out


def mid_quantiles(samples: np.ndarray, probs: Sequence[float]) -> np.ndarray:
    """Quantiles of `samples` read off their mid-distribution function (each distinct value at the
    middle of its probability step, linear between): the Hazen percentile for distinct samples,
    and for tied ones (the mean of a few tasks' 0/1 scores takes few values) a figure that moves
    smoothly with the resample, not by a whole step between two values."""
    values, counts = np.unique(np.round(samples, 12), return_counts=True)
    mid = (np.cumsum(counts) - counts / 2) / samples.size
    return np.interp(probs, mid, values)


def verdict(interval: Interval, threshold: float) -> str:
    """"pass" when the whole interval is at or above `threshold` (thresholds read ">="), "FAIL"
    when the whole interval is below it, "inconclusive" when it straddles it."""
    if interval.low >= threshold:
        return "pass"
    if interval.high < threshold:
        return "FAIL"
    return "inconclusive"


def paired_variance(base: Scores, trained: Scores) -> tuple[float, int, float]:
    """(the sample variance of the per-task gain, the number of tasks, the mean number of
    episodes a task had): what `episodes_to_resolve` needs from a recorded row."""
    b, t = task_means(base), task_means(trained)
    diffs = [t[task] - b[task] for task in t]
    if len(diffs) < 2:
        raise ValueError("the variance of the per-task gain needs two tasks or more")
    episodes = [len(v) for v in (*base.values(), *trained.values())]
    return float(np.var(diffs, ddof=1)), len(diffs), sum(episodes) / len(episodes)


def episodes_to_resolve(pair_variance: float, gain: float = 0.10, level: float = LEVEL) -> int:
    """The episodes (tasks x episodes a task, each played by base and trained) whose `level`
    interval of the gain is at most `gain` wide on each side: z^2 * variance / gain^2. Assumes
    the standard error of the paired difference is sqrt(pair_variance / episodes): one episode
    pair's variance (a task's gain variance times its episodes) shrinking with the count, as if
    every episode were a fresh task. Extra episodes of the same tasks shrink it less when
    tasks differ in what training does to them."""
    z = NormalDist().inv_cdf((1 + level) / 2)
    return max(1, math.ceil(z * z * pair_variance / (gain * gain) - 1e-9))

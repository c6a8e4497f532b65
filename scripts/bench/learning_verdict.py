"""A learning row's verdict: the per-task scores of its two test evaluations (the eval reports'
episodes), the 95 % intervals of base, trained and the gain (`scripts/bench/stats.py`'s paired
bootstrap over tasks), and pass / FAIL / inconclusive from the interval the threshold is about
(the gain's for a `>= base + X` threshold, the trained score's for a `>= X` one); and the text
the tables show for them.

A row that has no interval (its metric has no per-episode score, one task, or it was recorded
before the bench kept per-task scores) is judged on its point figures, as every row was before
2026-12-06, and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from scripts.bench.common import fmt
from scripts.bench.stats import Interval, paired_bootstrap, verdict

# A metric with a per-episode score: the eval report's episode field it is the mean of (a
# failed episode counts 0, as in ajet.eval.metrics.summarize).
EPISODE_FIELD = {"success/rate": "success", "reward/mean": "reward"}
RECORDED_BEFORE = "recorded before the bench kept per-task scores"
INTERVAL = "interval"  # Judgement.judged when the verdict came from the interval


@dataclass
class Judgement:
    status: str  # "pass", "FAIL" or "inconclusive"
    judged: str  # INTERVAL, or why the point figures decided
    scores: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # "base"/"trained" -> task -> episodes
    intervals: dict[str, list[float]] = field(default_factory=dict)  # "base"/"trained"/"gain" -> [low, high]


def task_scores(report: Path, metric: str) -> dict[str, list[float]]:
    """Task id -> its episodes' scores in an eval report ({} when the metric has no per-episode
    score or the report lists no episodes)."""
    key = EPISODE_FIELD.get(metric)
    if key is None:
        return {}
    out: dict[str, list[float]] = {}
    for episode in json.loads(report.read_text()).get("episodes", []):
        out.setdefault(str(episode["task_id"]), []).append(float(episode[key]))
    return out


def judge(*, metric: str, threshold: float, gain: bool, base: float | None, trained: float,
          base_report: Path | None, trained_report: Path) -> Judgement:
    """The verdict of a finished row. `threshold` is the example's (a gain when `gain`);
    `base_report` None: the base is a cached figure, taken as exact."""
    if metric not in EPISODE_FIELD:
        return point(threshold, gain, base, trained, f"{metric} has no per-episode score")
    scores = {"trained": task_scores(trained_report, metric)}
    if base_report is not None:
        scores["base"] = task_scores(base_report, metric)
    if not all(scores.values()):
        return point(threshold, gain, base, trained, "an eval report lists no episodes")
    found = intervals(scores, base)
    if found is None:
        return point(threshold, gain, base, trained, "one test task", scores)
    judged_on = Interval(*found["gain" if gain else "trained"])
    return Judgement(verdict(judged_on, threshold), INTERVAL, scores, found)


def intervals(scores: dict[str, dict[str, list[float]]], base: float | None) -> dict[str, list[float]] | None:
    """The recorded form of a row's intervals ("base"/"trained"/"gain" -> [low, high]) from its
    per-task scores; without base scores, `base` is the cached figure. None with one task."""
    found = paired_bootstrap(scores.get("base"), scores["trained"], base_value=base)
    return None if found is None else {k: v.as_list() for k, v in found.items()}


def point(threshold: float, gain: bool, base: float | None, trained: float, why: str,
          scores: dict[str, dict[str, list[float]]] | None = None) -> Judgement:
    """The rule before intervals: the trained score at or above the threshold (base + it for a gain)."""
    reached = trained >= ((base or 0.0) + threshold if gain else threshold)
    return Judgement("pass" if base is not None and reached else "FAIL", why, scores or {})


# ---------------------------------------------------------------------- text


def ci(interval: list[float] | None) -> str:
    """`[0.16, 0.32]`: two decimals, the precision the bootstrap is stable to ("" for none)."""
    return f"[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""


def score_text(value: float | None, interval: list[float] | None) -> str:
    return " ".join(s for s in (fmt(value), ci(interval)) if s)


def gain_text(base: float | None, trained: float | None, intervals: dict[str, list[float]]) -> str:
    """`+0.125 [0.03, 0.22]`; `+0.125 (no CI)` without an interval; "—" without both figures."""
    if base is None or trained is None:
        return "—"
    return f"{trained - base:+.3f} " + (ci(intervals["gain"]) if intervals.get("gain") else "(no CI)")


def why_no_interval(judged: str) -> str:
    """Why a row has no interval ("" when it has one)."""
    return "" if judged == INTERVAL else (judged or RECORDED_BEFORE)

"""How far behind the weights an episode may be: `rollout.max_staleness`, one rule for both
ways episodes can run ahead of the trainer.

- the debug backbone's overlap (`ajet.rollout.overlap.OverlappedEpisodes`): the next step rolls
  out while the trainer updates the weights;
- `ajet serve` (`ajet.serve.broker.EpisodeBroker`): clients begin the next steps' groups while
  the trainer updates.

An episode's lag is the current policy version minus the oldest version among its calls. An
ok episode more than `max_staleness` versions behind is not trained on: it is marked failed
with reason `stale` (`rollout/failed/stale`). The kept ones' lags are measured:
`rollout/staleness_mean`, `rollout/staleness_max` and `rollout/stale_kept` (kept episodes that
lag at all).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ajet.rollout.episode import FAILED, OK, Episode
from ajet.rollout.manager import RolloutResult

log = logging.getLogger(__name__)

STALE = "stale"


def lag(episode: Episode, version: int) -> int:
    """Policy versions between `version` and the episode's oldest call (0 without calls)."""
    versions = list(episode.policy_versions or [])
    return version - min(versions) if versions else 0


def drop_stale(episodes: Iterable[Episode], version: int, max_staleness: int) -> tuple[list[Episode], list[int]]:
    """Mark the ok episodes more than `max_staleness` versions behind `version` failed (`stale`),
    in place, their timelines dropped; returns (the stale ones, the kept ones' lags)."""
    stale: list[Episode] = []
    kept: list[int] = []
    for episode in episodes:
        if episode.status != OK:
            continue
        behind = lag(episode, version)
        if behind <= max_staleness:
            kept.append(behind)
            continue
        episode.status, episode.reason = FAILED, STALE
        episode.error_message = (f"its oldest call ran on policy version {min(episode.policy_versions)}, {behind} "
                                 f"behind {version}: more than rollout.max_staleness={max_staleness}")
        episode.timelines = []
        stale.append(episode)
    if stale:
        log.info("%d episode(s) more than rollout.max_staleness=%d versions behind were not trained on",
                 len(stale), max_staleness)
    return stale, kept


def staleness_metrics(kept_lags: list[int]) -> dict[str, float]:
    return {"rollout/staleness_mean": sum(kept_lags) / len(kept_lags) if kept_lags else 0.0,
            "rollout/staleness_max": float(max(kept_lags, default=0)),
            "rollout/stale_kept": float(sum(lag > 0 for lag in kept_lags))}


def keep_fresh(result: RolloutResult, version: int, max_staleness: int) -> RolloutResult:
    """`drop_stale` over a step's episodes, the stale ones taken out of `ok_episodes`, and the
    staleness metrics added. In place."""
    stale, kept = drop_stale(result.episodes, version, max_staleness)
    if stale:
        ids = {e.episode_id for e in stale}
        result.ok_episodes = [e for e in result.ok_episodes if e.episode_id not in ids]
    result.extra_metrics.update(staleness_metrics(kept))
    return result

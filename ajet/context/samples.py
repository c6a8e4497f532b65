"""One episode's timelines -> its trainable samples: merged, within the token budgets.

Every backbone and recipe turns episodes into samples here (the debug backbone's RL step, the
GPU backbones' workers, DPO's pairs); advantages are each algorithm's own business, filled in
afterwards (`ajet.algorithms.advantages.assign_token_advantages`).
"""

from __future__ import annotations

from typing import Protocol

from ajet.config.schema import ContextConfig
from ajet.context.budget import apply_budget
from ajet.context.merge import merge_timelines, timelines_to_samples
from ajet.context.types import Sample, Timeline


class EpisodeTimelines(Protocol):
    """What samples are made of: an episode's timelines and ids, and its reward
    (`ajet.rollout.episode.Episode` has these; this layer sits below it)."""

    @property
    def timelines(self) -> list[Timeline]: ...

    @property
    def episode_id(self) -> str: ...

    @property
    def group_id(self) -> str: ...

    @property
    def reward(self) -> float: ...


def episode_samples(episode: EpisodeTimelines, context: ContextConfig,
                    model_max_len: int) -> tuple[list[Sample], dict[str, int]]:
    """An ok episode's samples (its timelines merged when `context.merge`) within the budgets,
    and the budget's overflow counts. With per-role rewards (`role_rewards`, when the episode
    has them) each sample carries its role's reward."""
    timelines = merge_timelines(episode.timelines) if context.merge else list(episode.timelines)
    samples = timelines_to_samples(timelines, episode_id=episode.episode_id, group_id=episode.group_id,
                                   reward=float(episode.reward))
    role_rewards: dict[str, float] = getattr(episode, "role_rewards", None) or {}  # DPO's and the tests' episodes may have none
    for sample in samples:
        sample.reward = float(role_rewards.get(sample.role, sample.reward))
    return apply_budget(samples, context, model_max_len)

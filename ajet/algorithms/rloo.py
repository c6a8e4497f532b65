"""RLOO (arXiv 2402.14740): each episode's reward against the mean of the other episodes of its
task, `r_i - mean(r_j, j != i)`; PPO's clipped loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ajet.algorithms.base import (
    AlgorithmSpec,
    check_lengths,
    clipped_policy_loss,
    group_indices,
    require_finite,
)

if TYPE_CHECKING:
    from ajet.config.schema import AlgorithmConfig


def rloo_advantages(rewards: Sequence[float], group_ids: Sequence[str]) -> list[float]:
    """RLOO: `r_i - mean(r_j for j != i)` within the group; a group of one gets 0."""
    check_lengths(rewards, group_ids)
    require_finite(rewards)
    out = [0.0] * len(rewards)
    for idx in group_indices(group_ids).values():
        n = len(idx)
        if n < 2:
            continue
        total = sum(float(rewards[i]) for i in idx)
        for i in idx:
            r = float(rewards[i])
            out[i] = r - (total - r) / (n - 1)
    return out


def advantages(config: AlgorithmConfig, episode_ids: Sequence[str], rewards: Sequence[float],
               group_ids: Sequence[str], step_rewards: Sequence[Sequence[float] | None] | None) -> dict[str, float]:
    return dict(zip(episode_ids, rloo_advantages(rewards, group_ids), strict=True))


SPEC = AlgorithmSpec(
    name="rloo",
    summary="leave-one-out baseline within the task's group, PPO's clipped loss",
    recipe="rl",
    advantages=advantages,
    loss=clipped_policy_loss,
    loss_terms=("policy", "kl", "entropy"),
    needs_groups=True,
    backbone_names={"trinity": "rloo", "verl": "rloo", "tinker": "ppo"},
)

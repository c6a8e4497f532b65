"""REINFORCE++ (arXiv 2501.03262): discounted returns per LLM call (per-call rewards, the final
reward on the last call), whitened over the whole batch; no groups needed. PPO's clipped loss."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ajet.algorithms.base import (
    AlgorithmSpec,
    clipped_policy_loss,
    require_finite,
    returns_with_final,
)

if TYPE_CHECKING:
    from ajet.config.schema import AlgorithmConfig


def reinforce_pp_advantages(
    rewards: Sequence[float],
    *,
    step_rewards: Sequence[Sequence[float] | None] | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> list[list[float]]:
    """REINFORCE++: discounted returns per step, whitened over the whole batch.

    Episode `i` has steps (its LLM calls, in call order) with rewards `step_rewards[i]`;
    its final reward `rewards[i]` is added to the last step. Without step rewards (or
    with `None`/`[]` for an episode) the episode is one step carrying its final reward.
    The returns of every step of every episode are then whitened together as verl's
    `masked_whiten` does: `(G - mean) / sqrt(var + eps)`, unbiased variance. verl
    whitens over tokens; here each step counts once (`assign_token_advantages` spreads
    a step's value over its tokens). A batch with a single step gets 0.
    """
    if step_rewards is not None and len(step_rewards) != len(rewards):
        raise ValueError(
            f"step_rewards ({len(step_rewards)}) must have one entry per episode "
            f"({len(rewards)} rewards)"
        )
    require_finite(rewards)
    returns: list[list[float]] = []
    for i, final in enumerate(rewards):
        steps = list(step_rewards[i] or []) if step_rewards is not None else []
        returns.append(returns_with_final([float(x) for x in steps] or [0.0], final, gamma))

    flat = [g for ep in returns for g in ep]
    n = len(flat)
    if n == 0:
        return returns
    mean = sum(flat) / n
    var = sum((g - mean) ** 2 for g in flat) / (n - 1) if n > 1 else 0.0
    scale = 1.0 / math.sqrt(var + eps)
    return [[(g - mean) * scale for g in ep] for ep in returns]


def advantages(config: AlgorithmConfig, episode_ids: Sequence[str], rewards: Sequence[float],
               group_ids: Sequence[str], step_rewards: Sequence[Sequence[float] | None] | None,
               ) -> dict[str, list[float]]:
    """One value per LLM call of each episode."""
    per_step = reinforce_pp_advantages(rewards, step_rewards=step_rewards, gamma=config.gamma)
    return dict(zip(episode_ids, per_step, strict=True))


SPEC = AlgorithmSpec(
    name="reinforce_pp",
    summary="discounted per-call returns whitened over the batch (no groups), PPO's clipped loss",
    recipe="rl",
    advantages=advantages,
    loss=clipped_policy_loss,
    loss_terms=("policy", "kl", "entropy"),
    backbone_names={"trinity": "reinforceplusplus", "verl": "reinforce_plus_plus", "tinker": "ppo"},
)

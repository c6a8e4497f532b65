"""GRPO (arXiv 2402.03300): each episode's reward against its task's group, `(r - mean) / (std + eps)`;
Dr.GRPO's `r - mean` with `algorithm.norm_adv_by_std: false`. The loss is PPO's clipped
surrogate, plus a KL term and an entropy bonus when their coefficients are set. GiGPO's step
credit (`algorithm.step_credit: gigpo`, ajet/algorithms/gigpo.py) adds to these advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ajet.algorithms.base import (
    AlgorithmSpec,
    check_lengths,
    clipped_policy_loss,
    group_indices,
    normalised,
    require_finite,
)

if TYPE_CHECKING:
    from ajet.config.schema import AlgorithmConfig


def grpo_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[str],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> list[float]:
    """GRPO: `(r - mean_group) / (std_group + eps)`, or `r - mean_group` (Dr.GRPO).

    The std is the unbiased one (n - 1 denominator), as `torch.std` in verl and TRL.
    A group of one episode has no baseline and gets advantage 0 (verl instead passes
    its raw reward through; a lone sample carries no relative signal, so we drop it).
    """
    check_lengths(rewards, group_ids)
    require_finite(rewards)
    out = [0.0] * len(rewards)
    for idx in group_indices(group_ids).values():
        if len(idx) < 2:
            continue
        for i, value in zip(idx, normalised([float(rewards[i]) for i in idx], norm_by_std, eps), strict=True):
            out[i] = value
    return out


def advantages(config: AlgorithmConfig, episode_ids: Sequence[str], rewards: Sequence[float],
               group_ids: Sequence[str], step_rewards: Sequence[Sequence[float] | None] | None) -> dict[str, float]:
    """The group baseline, per episode (per-call rewards are not read)."""
    return dict(zip(episode_ids, grpo_advantages(rewards, group_ids, norm_by_std=config.norm_adv_by_std),
                    strict=True))


SPEC = AlgorithmSpec(
    name="grpo",
    summary="group-relative advantages, PPO's clipped loss",
    recipe="rl",
    advantages=advantages,
    loss=clipped_policy_loss,
    loss_terms=("policy", "kl", "entropy"),
    needs_groups=True,
    step_credit=("gigpo",),
    # Trinity's step-wise GRPO is `trinity.algorithm_type` (multi_step_grpo by default).
    backbone_names={"trinity": "multi_step_grpo", "verl": "grpo", "tinker": "ppo"},
)

"""PPO without a critic: GRPO's group baseline for the advantages, PPO's clipped loss over
`trainer.ppo_epochs` passes. The GPU backbones' PPO would need a critic, which their adapters
do not set up; the tinker backbone sends the clipped loss as the service's built-in `ppo`."""

from __future__ import annotations

from ajet.algorithms import grpo
from ajet.algorithms.base import AlgorithmSpec, clipped_policy_loss

SPEC = AlgorithmSpec(
    name="ppo",
    summary="PPO's clipped loss with the group baseline (no critic)",
    recipe="rl",
    advantages=grpo.advantages,
    loss=clipped_policy_loss,
    loss_terms=("policy", "kl", "entropy"),
    needs_groups=False,
    # The tinker backbone computes the advantages here and sends the clipped loss as the service's `ppo`.
    backbone_names={"tinker": "ppo"},
    elsewhere="ppo would need a critic there, which the adapter does not set up; use grpo "
              "(the same clipped loss with group advantages)",
)

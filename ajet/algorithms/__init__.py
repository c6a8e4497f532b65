"""Algorithms: one file each (grpo, rloo, reinforce_pp, ppo, distill, sft, dpo; gigpo's step
credit), listed in `ajet.algorithms.registry`. Advantages are plain Python, losses torch.

Importing this package does not import torch: the losses are imported from
`ajet.algorithms.losses`, which does.
"""

from __future__ import annotations

from ajet.algorithms.advantages import (
    assign_token_advantages,
    compute_advantages,
    compute_role_advantages,
)
from ajet.algorithms.base import AlgorithmSpec, LossInputs, discounted_returns
from ajet.algorithms.dpo import build_preference_pairs, dpo_loss
from ajet.algorithms.gigpo import gigpo_advantages
from ajet.algorithms.grpo import grpo_advantages
from ajet.algorithms.reference import ReferencePolicy, build_reference
from ajet.algorithms.registry import get_algorithm, register
from ajet.algorithms.reinforce_pp import reinforce_pp_advantages
from ajet.algorithms.rloo import rloo_advantages

__all__ = [
    "AlgorithmSpec",
    "LossInputs",
    "assign_token_advantages",
    "build_preference_pairs",
    "build_reference",
    "compute_advantages",
    "compute_role_advantages",
    "discounted_returns",
    "dpo_loss",
    "get_algorithm",
    "gigpo_advantages",
    "grpo_advantages",
    "register",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "ReferencePolicy",
]

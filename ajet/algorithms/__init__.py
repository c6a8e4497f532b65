"""Algorithms as pure functions: advantages (plain Python), losses (torch), DPO, KL reference.

Importing this package does not import torch: the losses are imported from
`ajet.algorithms.losses`, which does.
"""

from __future__ import annotations

from ajet.algorithms.advantages import (
    assign_token_advantages,
    compute_advantages,
    discounted_returns,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from ajet.algorithms.dpo import build_preference_pairs, dpo_loss
from ajet.algorithms.reference import ReferencePolicy, build_reference

__all__ = [
    "assign_token_advantages",
    "build_preference_pairs",
    "build_reference",
    "compute_advantages",
    "discounted_returns",
    "dpo_loss",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "ReferencePolicy",
]


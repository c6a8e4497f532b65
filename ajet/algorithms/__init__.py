"""Algorithms as pure functions: advantages (plain Python), losses (torch), DPO, KL reference.

Importing this package does not import torch; the loss functions load it on first use.
"""

from __future__ import annotations

from typing import Any

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

_LOSSES = ("policy_loss", "kl_penalty", "entropy_from_logits", "sft_loss")

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
    *_LOSSES,
]


def __getattr__(name: str) -> Any:
    if name in _LOSSES:
        from ajet.algorithms import losses

        return getattr(losses, name)
    raise AttributeError(f"module 'ajet.algorithms' has no attribute {name!r}")

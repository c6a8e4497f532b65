"""DPO: the loss over sequence-level log-probs (as TRL's DPOTrainer) and pair building.

`policy_*_logps` / `ref_*_logps` are 1-D tensors, one summed completion log-prob per
pair. For `loss_type="ipo"` TRL divides each sequence's log-prob by its token count
first (the IPO paper's length-averaged log-likelihood); the caller does that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ajet.algorithms.base import AlgorithmSpec, Problems
from ajet.algorithms.options import DpoLoss, ReferenceModel

if TYPE_CHECKING:
    from torch import Tensor

    from ajet.config.schema import AjetConfig


DPO_LOSS_TYPES = tuple(kind.value for kind in DpoLoss)


def config_problems(cfg: AjetConfig) -> Problems:
    """A pair per task, and a reference that exists."""
    out: Problems = []
    a = cfg.algorithm
    if cfg.rollout.n < 2:
        out.append(("rollout.n", "dpo pairs the best and worst of a task's episodes: set rollout.n >= 2"))
    if a.dpo_reference == ReferenceModel.lora_base and not a.dpo_reference_free and not cfg.model.lora.enabled:
        out.append(("algorithm.dpo_reference", "'lora_base' needs model.lora.enabled=true; use 'frozen' for full "
                                               "fine-tuning"))
    return out


SPEC = AlgorithmSpec(name="dpo", summary="direct preference optimisation over the best and worst episode of a task",
                     recipe="dpo", config_problems=config_problems,
                     elsewhere="dpo is not an RL algorithm and has no GPU adapter; run it on --backbone=debug")


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    *,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    reference_free: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-pair losses and the implicit rewards `beta * (policy - ref)` (detached).

    logits = (pi_c - pi_r) - (ref_c - ref_r)   (the reference term is 0 if reference_free)
    sigmoid: -(1 - ls) * logsigmoid(beta * logits) - ls * logsigmoid(-beta * logits)
             (ls > 0 is conservative DPO, labels flipped with probability ls)
    hinge:   relu(1 - beta * logits)            (SLiC)
    ipo:     (logits - 1 / (2 * beta))^2        (IPO; beta plays the paper's tau)

    With `reference_free`, missing reference log-probs count as 0 (for the rewards too).
    """
    import torch
    import torch.nn.functional as F

    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"dpo loss_type {loss_type!r} unknown; use one of {DPO_LOSS_TYPES}")
    if beta <= 0:
        raise ValueError(f"dpo beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"dpo label_smoothing must be in [0, 0.5], got {label_smoothing}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError("label_smoothing applies to loss_type='sigmoid' only")
    if ref_chosen_logps is None or ref_rejected_logps is None:
        if not reference_free:
            raise ValueError("reference log-probs are required unless reference_free=True")
        ref_chosen_logps = torch.zeros_like(policy_chosen_logps)
        ref_rejected_logps = torch.zeros_like(policy_rejected_logps)

    logratios = policy_chosen_logps - policy_rejected_logps
    ref_logratios = 0.0 if reference_free else ref_chosen_logps - ref_rejected_logps
    logits = logratios - ref_logratios

    if loss_type == "sigmoid":
        losses = (
            -F.logsigmoid(beta * logits) * (1.0 - label_smoothing)
            - F.logsigmoid(-beta * logits) * label_smoothing
        )
    elif loss_type == "hinge":
        losses = torch.relu(1.0 - beta * logits)
    else:
        losses = (logits - 1.0 / (2.0 * beta)) ** 2

    chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps).detach()
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards


def build_preference_pairs(
    episodes: Sequence[tuple[str, str, float]],
) -> list[tuple[str, str]]:
    """One `(chosen_episode_id, rejected_episode_id)` per group: its best vs its worst.

    `episodes` holds `(group_id, episode_id, reward)`. A group whose best and worst
    rewards are equal (all tied, or a single episode) gives no pair. Among tied best
    (or worst) episodes the first one listed wins; groups keep first-seen order.
    """
    best: dict[str, tuple[str, float]] = {}
    worst: dict[str, tuple[str, float]] = {}
    for group_id, episode_id, reward in episodes:
        reward = float(reward)
        if group_id not in best or reward > best[group_id][1]:
            best[group_id] = (episode_id, reward)
        if group_id not in worst or reward < worst[group_id][1]:
            worst[group_id] = (episode_id, reward)
    return [(best[g][0], worst[g][0]) for g in best if best[g][1] > worst[g][1]]

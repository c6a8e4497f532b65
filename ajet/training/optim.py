"""The optimizer and learning-rate schedule every recipe uses.

AdamW over the trainable parameters: `torch.optim.AdamW`, or with
`trainer.optimizer_state_dtype: bfloat16` the same update with its moments stored in bf16
(`ajet.training.adamw`, half the optimizer memory). On a CPU torch's AdamW already runs
parameter by parameter (its multi-tensor `foreach` path is for GPUs), so its step needs
no parameter-sized temporaries beyond the largest parameter. The schedule is a factor of `trainer.lr` per training
step: linear warmup over `warmup_steps`, then constant, linear decay to 0 or cosine decay to 0
at `total_steps`. **It advances once per training step** (`scheduler.step()` after the step,
whether or not the step updated the weights), so the schedule follows the step count the
user configured in every recipe.
"""

from __future__ import annotations

import math
from typing import Any

from ajet.config.schema import LrSchedule, OptimizerStateDType, TrainerConfig
from ajet.training.adamw import BF16StateAdamW


def lr_factor(step: int, cfg: TrainerConfig) -> float:
    """The factor on `cfg.lr` at training step `step` (0-based: the step being trained). Pure."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == LrSchedule.constant:
        return 1.0
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.lr_schedule == LrSchedule.linear:
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


def build_optimizer(model: Any, cfg: TrainerConfig, *, seed: int = 0) -> tuple[Any, Any]:
    """(AdamW over the trainable parameters, its LambdaLR schedule from `lr_factor`). `seed`:
    the stochastic rounding of bf16 optimizer state."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RuntimeError("the model has no trainable parameters (LoRA target_modules matched nothing?)")
    if cfg.optimizer_state_dtype == OptimizerStateDType.bfloat16:
        optimizer = BF16StateAdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, seed=seed)
    else:
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))

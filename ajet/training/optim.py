"""The optimizer and learning-rate schedule every recipe uses.

AdamW over the trainable parameters: `torch.optim.AdamW`, or with
`trainer.optimizer_state_dtype: bfloat16` the same update with its moments stored in bf16
(`ajet.training.adamw`, half the optimizer memory). torch's AdamW runs with `fused=True`
where it can (floating-point parameters on one CPU or CUDA device): one kernel per parameter,
no parameter-sized temporaries, and on 2 CPU cores 0.04 s for the bundled model's 128M
parameters against 0.61 s for the default per-parameter loop (scripts/bench/optimizer.py),
the same update within float rounding. The schedule is a factor of `trainer.lr` per training
step: linear warmup over `warmup_steps`, then constant, linear decay to 0 or cosine decay to 0
at `total_steps`. **It advances once per training step** (`scheduler.step()` after the step,
whether or not the step updated the weights), so the schedule follows the step count the
user configured in every recipe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ajet.config.schema import LrSchedule, OptimizerStateDType, TrainerConfig
from ajet.training.adamw import BF16StateAdamW

if TYPE_CHECKING:
    import torch


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


def build_optimizer(model: torch.nn.Module, cfg: TrainerConfig, *,
                    seed: int = 0) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """(AdamW over the trainable parameters, its LambdaLR schedule from `lr_factor`). `seed`:
    the stochastic rounding of bf16 optimizer state."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RuntimeError("the model has no trainable parameters (LoRA target_modules matched nothing?)")
    optimizer: torch.optim.Optimizer
    if cfg.optimizer_state_dtype == OptimizerStateDType.bfloat16:
        optimizer = BF16StateAdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, seed=seed)
    else:
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=can_fuse(params))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))


def can_fuse(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes these parameters: floating point, all on one CPU or
    CUDA device."""
    devices = {p.device for p in params}
    return (len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
            and all(p.is_floating_point() for p in params))

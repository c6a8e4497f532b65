"""The debug backbone: inference engine and trainer in one process (CPU or one GPU)."""

from __future__ import annotations

from typing import Any

from ajet.config.schema import AjetConfig


def check_config(cfg: AjetConfig) -> list[tuple[str, str]]:
    """Settings that would do nothing on the debug backbone."""
    problems = []
    for key, value, default in (
        ("trinity.explorer_gpus", cfg.trinity.explorer_gpus, 1),
        ("trinity.trainer_gpus", cfg.trinity.trainer_gpus, 1),
        ("verl.n_gpus_per_node", cfg.verl.n_gpus_per_node, 1),
        ("verl.nnodes", cfg.verl.nnodes, 1),
        ("verl.tensor_model_parallel_size", cfg.verl.tensor_model_parallel_size, 1),
    ):
        if value != default:
            problems.append((key, f"has no effect on --backbone=debug (one process); remove it or "
                                  f"use --backbone={key.split('.')[0]}"))
    return problems


def translate(cfg: AjetConfig) -> str | None:
    return None


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: Any = None) -> None:
    """The RL recipe (staged runs and SFT/DPO are dispatched by `ajet.pipeline.run`)."""
    # imports torch: this package is on the path of ajet --dry-run (registry.checked_backbone)
    from ajet.rl.recipe import train

    train(cfg, with_ray=with_ray, resume=resume, workflow=workflow)

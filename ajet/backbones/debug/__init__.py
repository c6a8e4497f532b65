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
    from ajet.backbones.debug.trainer import train
    from ajet.config.schema import Algorithm

    # Staged runs (pipeline.stages) and the non-RL algorithms have their own loops (ajet/pipeline.py).
    if cfg.pipeline.stages or cfg.algorithm.name in (Algorithm.sft, Algorithm.dpo):
        from ajet.cli.common import UserError
        from ajet.pipeline import run_pipeline, run_stage, single_stage_config

        if with_ray:
            raise UserError("--with-ray is not implemented for sft, dpo or staged runs; run without it.")
        if cfg.pipeline.stages:
            run_pipeline(cfg, workflow=workflow, resume=resume)
        else:
            stage = cfg.algorithm.name.value
            run_stage(single_stage_config(cfg, stage), stage, workflow=workflow, resume=resume)
        return
    train(cfg, with_ray=with_ray, resume=resume, workflow=workflow)

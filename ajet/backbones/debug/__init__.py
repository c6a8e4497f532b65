"""The debug backbone: inference engine and trainer in one process (CPU or one GPU)."""

from __future__ import annotations

from pathlib import Path

from ajet.algorithms.base import Problems
from ajet.algorithms.registry import get_algorithm
from ajet.backbones.contract import Capabilities
from ajet.config.schema import AjetConfig
from ajet.config.validate import single_stage_config
from ajet.rollout.workflow_loader import WorkflowArg

# Every algorithm, the stages one after the other (`ajet.pipeline`), the overlap, `ajet serve`;
# --with-ray for the RL recipe (its episodes in Ray actors).
CAPABILITIES = Capabilities(
    algorithms=None, stages=True, overlap=True, serve=True, ray_recipes=("rl",), per_role_adapters=True,
    group_judges=True, curriculum=True, task_selection=True, generated_tasks=True, cpu=True, keep_matmuls=True,
)


def check_config(cfg: AjetConfig) -> Problems:
    """Nothing beyond its capabilities: another backbone's settings (trinity.*, verl.*, tinker.*)
    are refused by `ajet.backbones.contract.capability_problems` for every backbone."""
    return []


def translate(cfg: AjetConfig, *, resume: bool = False) -> str | None:
    """None: the debug backbone has no config of its own."""
    return None


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: WorkflowArg | None = None) -> Path:
    """Run `algorithm.name`'s recipe (RL, SFT or DPO); return the run directory."""
    # The recipes import torch: this package is on the path of ajet --dry-run (registry.checked_backbone).
    recipe = get_algorithm(cfg.algorithm.name).recipe
    if recipe == "sft":
        from ajet.sft.recipe import train_sft

        return train_sft(single_stage_config(cfg, cfg.algorithm.name), resume=resume)  # pipeline.overrides.sft merged in
    if recipe == "dpo":
        from ajet.dpo.recipe import train_dpo

        return train_dpo(single_stage_config(cfg, cfg.algorithm.name), resume=resume, workflow=workflow)
    from ajet.rl.recipe import train

    return train(cfg, with_ray=with_ray, resume=resume, workflow=workflow)


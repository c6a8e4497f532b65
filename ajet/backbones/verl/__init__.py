"""verl backbone (GPU clusters): our config translated to verl's Hydra overrides, our episode
runner as a verl agent loop (`ajet.backbones.verl.agent_loop`)."""

from __future__ import annotations

from pathlib import Path

from ajet.algorithms.base import Problems
from ajet.algorithms.registry import backbone_algorithms
from ajet.backbones.contract import Capabilities
from ajet.backbones.gpu_checks import require_gpus
from ajet.backbones.gpu_config import dump_yaml, model_path_for, with_workflow
from ajet.backbones.verl import translation
from ajet.backbones.verl.driver import run_verl
from ajet.config.schema import AjetConfig
from ajet.rollout.workflow_loader import WorkflowArg

CAPABILITIES = Capabilities(
    algorithms=tuple(backbone_algorithms("verl")), stages=False, overlap=False, serve=False, ray_recipes=("rl",),
    per_role_adapters=False, group_judges=False, curriculum=False, task_selection=False, generated_tasks=False, cpu=False, keep_matmuls=False,
    section="verl",
)


def check_config(cfg: AjetConfig) -> Problems:
    return translation.check_config(cfg)


def translate(cfg: AjetConfig, *, resume: bool = False) -> str:
    """The verl overrides this run would use, as YAML (what --dry-run prints)."""
    model_path, found = model_path_for(cfg)
    header = (f"# verl overrides of ppo_trainer (key names of verl {translation.VERL_VERSION}); "
              "passed as key=value to python -m verl.trainer.main_ppo\n")
    if not found:
        header += f"# model.path={model_path} is not on this machine; used as given\n"
    return header + dump_yaml(translation.to_verl_config(cfg, model_path=model_path, resume=resume))


def run(cfg: AjetConfig, *, with_ray: bool, resume: bool, workflow: WorkflowArg | None = None) -> Path | None:
    """Export the tasks, write verl's overrides, and run verl's trainer (needs GPUs)."""
    require_gpus("verl", "verl", "verl")
    run_verl(with_workflow(cfg, workflow), resume=resume)
    return None  # its outputs are verl's, under the run directory
